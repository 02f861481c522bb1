#!/usr/bin/env bash
# Builds pyfuse3 3.5.0 with third_party/pyfuse3/avafs.patch (FileInfo.noflush, a read sent
# without an open given the inode, its asyncio mode's request loop and failures, opendir's
# FileInfo with cache_readdir, parallel directory operations, and reads answered with a range
# of a file, spliced) as a wheel, versioned
# 3.5.0+avafs8 so that pip prefers it to PyPI's 3.5.0 when both are offered.
#
#   scripts/build_pyfuse3.sh install      # build it and install it (skipped if installed)
#   scripts/build_pyfuse3.sh wheel DIR    # build the wheel into DIR (the CSI image)
#
# It is linked against libfuse 3.17, built from Debian's source by scripts/build_libfuse.sh
# and carried inside the extension module. Where that source cannot be had, it is built
# against the system's libfuse3 instead, versioned 3.5.0+avafs8.system, with a warning:
# avafs runs the same on it, but lookups in one directory wait for each other (libfuse 3.14
# never asks the kernel for parallel directory operations). `install` builds again until
# the libfuse 3.17 build has succeeded once.
#
# Builds for, and installs into, the python3 first on PATH (scripts/install.sh puts its
# virtual environment's there). Needs gcc, pkg-config, meson, ninja-build, libfuse3-dev and
# that Python's headers (python3-dev for Debian's); Cython and setuptools_scm are installed
# for the build in the same environment (an isolated build fetches them every time, and
# slower). avafs runs on stock pyfuse3 too, with one to three more round trips per file read
# and more per directory read (third_party/pyfuse3/README.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=3.5.0
local_version="$version+avafs8"
mode="${1:-install}"

installed="$(python3 -c 'import importlib.metadata as m; print(m.version("pyfuse3"))' \
  2>/dev/null || true)"
if [[ "$mode" == install && "$installed" == "$local_version" ]]; then
  exit 0
fi
if [[ "$mode" != install && "$mode" != wheel ]] || [[ "$mode" == wheel && $# -ne 2 ]]; then
  echo "usage: $0 install | wheel DIR" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip=(python3 -m pip --disable-pip-version-check -q)
"${pip[@]}" install 'cython>=3' 'setuptools>=78.1.1' 'setuptools_scm>=8'
# The sdist's version comes from setuptools_scm, which finds no git tag in an unpacked sdist.
export SETUPTOOLS_SCM_PRETEND_VERSION="$version"
# Only pyfuse3 itself from source, its metadata prepared with the tools just installed: with
# `--no-binary :all:` its build requirements would have to build from source too, and recent
# setuptools_scm sdists cannot (they need a VCS checkout to learn their own version).
"${pip[@]}" download --no-deps --no-build-isolation --no-binary pyfuse3 --dest "$work" \
  "pyfuse3==$version"
tar -xzf "$work/pyfuse3-$version.tar.gz" -C "$work"
source_dir="$work/pyfuse3-$version"
patch -s -d "$source_dir" -p1 < "$root/third_party/pyfuse3/avafs.patch"
if "$root/scripts/build_libfuse.sh" "$work/libfuse"; then
  export PKG_CONFIG_PATH="$work/libfuse/lib/pkgconfig"
else
  echo "warning: pyfuse3 is built against the system's libfuse3; lookups in one directory" \
    "will wait for each other" >&2
  local_version="$local_version.system"
fi
# The sdist ships the C that Cython made from the unpatched .pyx; the build makes it again.
rm -f "$source_dir/src/pyfuse3/__init__.c"
export SETUPTOOLS_SCM_PRETEND_VERSION="$local_version"
if [[ "$mode" == wheel ]]; then
  "${pip[@]}" wheel --no-build-isolation --no-deps --wheel-dir "$2" "$source_dir"
else
  "${pip[@]}" wheel --no-build-isolation --no-deps --wheel-dir "$work/wheel" "$source_dir"
  "${pip[@]}" install --force-reinstall --no-deps "$work"/wheel/pyfuse3-*.whl
fi
