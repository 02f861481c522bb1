"""The install on a stock Debian 12, where `python3` is Debian's own /usr/bin/python3 and its pip
refuses to install (PEP 668, "externally-managed-environment"): the virtual environment
scripts/venv.sh makes with it installs packages, and its pip reads the machine's pip
configuration (the package index) as any pip does. The whole install, torch and tensorflow
included, takes minutes: CI runs it (`.ci/run`), the suite checks only this step."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

DEBIAN_PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]


def tiny_wheel(folder: Path) -> Path:
    """A one-module package as a wheel, installable with no index."""
    info = "avafs_tiny-1.0.dist-info"
    wheel = folder / "avafs_tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("avafs_tiny.py", "VALUE = 'installed'\n")
        archive.writestr(f"{info}/METADATA",
                         "Metadata-Version: 2.1\nName: avafs-tiny\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def run(*command: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_venv_made_with_debians_python_installs_what_its_pip_refuses(tmp_path):
    wheel = tiny_wheel(tmp_path)
    refused = run(DEBIAN_PYTHON, "-m", "pip", "install", "--no-index", wheel)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr

    venv = tmp_path / "venv"
    made = run("bash", REPO / "scripts" / "venv.sh", venv,
               env={**os.environ, "PATH": f"/usr/bin:{os.environ['PATH']}"})
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    assert run(python, "-c", "import sys; print(sys.base_prefix)").stdout == "/usr\n"
    installed = run(python, "-m", "pip", "install", "--no-index", wheel)
    assert installed.returncode == 0, installed.stderr
    assert run(python, "-c", "import avafs_tiny; print(avafs_tiny.VALUE)").stdout == "installed\n"
    assert run(python, "-m", "pip", "config", "list").stdout == \
        run(DEBIAN_PYTHON, "-m", "pip", "config", "list").stdout
