#!/usr/bin/env bash
# Builds libfuse 3.17 as a static library into DIR, from the source package of Debian's stable
# release (trixie), for scripts/build_pyfuse3.sh to link pyfuse3 against:
#
#   scripts/build_libfuse.sh DIR     # DIR/lib/libfuse3.a, DIR/include, DIR/lib/pkgconfig
#
# Why not Debian 12's libfuse 3.14: it never passes FUSE_PARALLEL_DIROPS to the kernel (its
# INIT answer leaves the flag out whatever the file system asks), so the kernel holds a
# directory's lock through every LOOKUP of a new name, and files looked up by path in one
# directory are described one after another. libfuse 3.17 passes it when asked, and has the
# passthrough API besides.
#
# The source comes through apt, from a list of its own (deb-src of trixie, with its own state
# under a temporary directory): the machine's apt sources and preferences are not touched,
# and apt checks the files against the release's signed index. Static and without symbol
# versions, the library ends up inside pyfuse3's extension module: nothing is installed on
# the system, and the system's libfuse3 and fusermount3 stay what mounts use otherwise.
# Needs meson and ninja-build (Debian 12 has both), gcc and pkg-config. Exits non-zero with
# a one-line reason when the source cannot be had or does not build.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
suite=trixie
series=3.17

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/source"
echo "deb-src http://deb.debian.org/debian $suite main" > "$work/sources.list"
apt=(apt-get -q -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
if ! "${apt[@]}" update >"$work/apt.log" 2>&1 \
    || ! (cd "$work/source" && "${apt[@]}" source --download-only "fuse3/$suite") \
      >>"$work/apt.log" 2>&1; then
  echo "libfuse: Debian's fuse3 source ($suite) could not be fetched: $(tail -1 "$work/apt.log")" >&2
  exit 1
fi
tarball=""
for found in "$work/source"/fuse3_*.orig.tar.*; do
  [[ "$found" == *.asc || ! -f "$found" ]] || tarball="$found"
done
if [[ -z "$tarball" ]]; then
  echo "libfuse: Debian's fuse3 source ($suite) came without its upstream tarball" >&2
  exit 1
fi
version="$(basename "$tarball" | sed -E 's/^fuse3_([0-9.]+)\.orig\..*/\1/')"
if [[ "$version" != "$series".* ]]; then
  echo "libfuse: Debian $suite serves fuse3 $version, not $series.x, which this build expects" >&2
  exit 1
fi
tar -xf "$tarball" -C "$work/source"
# --prefix=/usr: libfuse runs fusermount3 from its prefix's bin for a mount without root,
# which is where Debian's fuse3 package puts it.
if ! meson setup "$work/build" "$work/source/fuse-$version" --prefix=/usr --libdir=lib \
      --buildtype=release -Ddefault_library=static -Ddisable-libc-symbol-version=true \
      -Dutils=false -Dexamples=false -Dtests=false >"$work/build.log" 2>&1 \
    || ! ninja -C "$work/build" >>"$work/build.log" 2>&1 \
    || ! DESTDIR="$work/root" meson install -C "$work/build" >>"$work/build.log" 2>&1; then
  echo "libfuse: building fuse3 $version failed: $(tail -1 "$work/build.log")" >&2
  exit 1
fi
rm -rf "$out/lib" "$out/include"
mkdir -p "$out/lib/pkgconfig"
cp -r "$work/root/usr/include" "$out/include"
cp "$work/root/usr/lib/libfuse3.a" "$out/lib/"
sed -e "s|^prefix=.*|prefix=$out|" "$work/root/usr/lib/pkgconfig/fuse3.pc" \
  > "$out/lib/pkgconfig/fuse3.pc"
echo "$version" > "$out/VERSION"
