#!/usr/bin/env bash
# Makes the virtual environment avafs is installed into (default: .venv in this clone), with the
# `python3` first on PATH. A Python that its distribution manages (Debian 12's /usr/bin/python3,
# PEP 668) refuses `pip install` outside one; a venv's pip reads the same pip configuration
# (/etc/pip.conf, /etc/xdg/pip, ~/.config/pip, PIP_* variables) as the interpreter's own.
# Keeps a working environment as it is, so re-running the install keeps what it installed.
# (Without Debian's python3-venv, which scripts/install.sh installs, `python3 -m venv` says so.)
#
#   scripts/venv.sh [DIR]
set -euo pipefail
venv="${1:-$(cd "$(dirname "$0")/.." && pwd)/.venv}"

if "$venv/bin/python" -c '' 2>/dev/null; then
  exit 0
fi
python3 -m venv --clear "$venv"
