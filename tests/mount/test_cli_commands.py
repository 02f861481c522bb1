"""`avafs refresh`, `warmup --check`, `flush PATH --timeout`, `status --watch`, a dead mount's
status, the progress a terminal shows (rendered by a terminal emulator under a pty), and where a
foreground mount's log goes."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import pyte
import pytest
from support import AVAFS, is_mounted, run_avafs, unmount

from adapters.sources import PrefixSource
from avafs.client import AvafsError, Client
from avafs.host.processes import wait_for_exit

MiB = 2**20


def test_refresh_shows_objects_created_in_the_store(local_bucket, mount):
    (local_bucket / "a").mkdir()
    (local_bucket / "a" / "old").write_bytes(b"old")
    mnt = mount(local_bucket.as_uri(), "--metadata-ttl", "3600")
    assert os.listdir(mnt / "a") == ["old"]
    assert not (mnt / "a" / "new").exists()
    (local_bucket / "a" / "new").write_bytes(b"new")
    (local_bucket / "a" / "newer").write_bytes(b"newer")

    result = run_avafs("warmup", str(mnt / "a" / "new"))
    assert result.returncode == 1
    assert "--metadata-ttl" in result.stderr and "avafs refresh PATH" in result.stderr
    assert not (mnt / "a" / "new").exists()
    (local_bucket / "b").mkdir()
    (local_bucket / "b" / "sample").write_bytes(b"s")
    with pytest.raises(NotADirectoryError, match="--metadata-ttl .*'avafs refresh PATH'"):
        PrefixSource(mnt / "b")
    with pytest.raises(AvafsError, match="--metadata-ttl .*'avafs refresh PATH'"):
        Client(mnt).list_files(mnt / "b")

    result = run_avafs("refresh", str(mnt / "a" / "new"))
    assert result.returncode == 0, result.stderr
    assert (mnt / "a" / "new").read_bytes() == b"new"
    assert run_avafs("warmup", str(mnt / "a" / "new")).returncode == 0

    (local_bucket / "a" / "old").unlink()
    Client(mnt).refresh(mnt / "a")
    assert sorted(os.listdir(mnt / "a")) == ["new", "newer"]


def test_warmup_check_counts_what_is_cached_and_fetches_nothing(local_bucket, mount):
    (local_bucket / "d").mkdir()
    for name in ("x", "y"):
        (local_bucket / "d" / name).write_bytes(os.urandom(3 * MiB))
    mnt = mount(local_bucket.as_uri(), "--block-size", "1Mi")
    client = Client(mnt)
    before = client.status()
    result = run_avafs("warmup", "--check", str(mnt / "d"))
    assert result.returncode == 1
    assert result.stdout.strip() == "cached: 0/2 files whole, 0 B of 6.0 MiB (0%)"
    assert client.status()["misses"] == before["misses"]
    assert client.status()["bytes_served"]["store"] == 0

    assert run_avafs("warmup", str(mnt / "d" / "x")).returncode == 0
    result = run_avafs("warmup", "--check", str(mnt / "d"))
    assert result.stdout.strip() == "cached: 1/2 files whole, 3.0 MiB of 6.0 MiB (50%)"
    assert client.check([mnt / "d"])["bytes_cached"] == 3 * MiB


def test_flush_of_a_path_with_a_timeout(s3_server, bucket, s3_mount, proxy):
    mnt = s3_mount("--writeback-delay", "3600", endpoint=proxy.endpoint)
    (mnt / "a").mkdir()
    (mnt / "a" / "ckpt").write_bytes(b"c" * 1000)
    (mnt / "b").mkdir()
    (mnt / "b" / "other").write_bytes(b"o" * 10)
    proxy.mode = "refuse"
    result = run_avafs("flush", str(mnt / "b"), "--timeout", "1")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"avafs: error: flush of {mnt / 'b'} timed out after 1s: ")
    assert "changes" in line and "not in the store yet" in line
    proxy.mode = "pass"
    result = run_avafs("flush", str(mnt / "b"), "--timeout", "120")
    assert result.returncode == 0, result.stderr
    keys = {item["Key"] for item in
            s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert "b/other" in keys


@pytest.fixture
def interruptible() -> Iterator[None]:
    """Children started meanwhile take SIGINT as a terminal's foreground command does, even
    when the suite itself was started with SIGINT ignored (a background job of a
    non-interactive shell), which every child would inherit across exec."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_status_watch_repeats_until_interrupted(local_bucket, mount, interruptible):
    mnt = mount(local_bucket.as_uri())
    watch = subprocess.Popen(AVAFS + ["status", "--watch", "0.1", str(mnt)],
                             stdout=subprocess.PIPE, text=True)
    reports = 0
    for line in watch.stdout:
        reports += line.startswith(f"avafs mount {mnt} ")
        if reports == 3:
            break
    watch.send_signal(signal.SIGINT)
    watch.communicate(timeout=30)  # drained: a watcher blocked on a full pipe cannot exit
    assert watch.returncode == 0
    assert reports == 3


def test_status_of_a_dead_mount_says_what_mount_says(local_bucket, mount):
    mnt = mount(local_bucket.as_uri())
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    assert wait_for_exit(pid, 30)
    result = run_avafs("status", str(mnt))
    assert result.returncode == 1
    assert result.stderr.strip() == (f"avafs: error: {mnt} is a dead mount (its daemon exited): "
                                     f"run 'avafs umount {mnt}' first")


def rendered(command: list[str], columns: int = 160, lines: int = 40) -> str:
    """The screen a terminal shows once `command` (run under a pty) has exited."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave,
                               env={**os.environ, "TERM": "xterm", "COLUMNS": str(columns)})
    os.close(slave)
    screen = pyte.Screen(columns, lines)
    stream = pyte.ByteStream(screen)
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command exited and closed the pty
            break
        if not data:
            break
        stream.feed(data)
    os.close(master)
    assert process.wait(timeout=120) == 0
    return "\n".join(line.rstrip() for line in screen.display if line.strip())


def test_warmup_on_a_terminal_ends_at_100_percent_with_counts_and_one_unit_system(
        local_bucket, mount):
    for i in range(3):
        (local_bucket / f"{i}.bin").write_bytes(os.urandom(3 * MiB))
    mnt = mount(local_bucket.as_uri())
    screen = rendered(AVAFS + ["warmup", str(mnt)])
    bar, summary = screen.splitlines()[-2:]
    assert bar.startswith("warmup") and "100%" in bar
    assert "3/3 files, 9.0 MiB/9.0 MiB" in bar
    assert summary.startswith("warmup 1 done: 3 files (9.0 MiB) loaded")
    for wrong in (" kB", " MB", "/?"):
        assert wrong not in screen


def test_flush_on_a_terminal_ends_with_everything_in_the_store(local_bucket, mount):
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "3600")
    (mnt / "out.bin").write_bytes(os.urandom(2 * MiB))
    screen = rendered(AVAFS + ["flush", str(mnt)])
    assert screen.splitlines()[-1].startswith("flush")
    assert "100%" in screen and "everything is in the store" in screen
    assert (local_bucket / "out.bin").stat().st_size == 2 * MiB


def test_listing_phase_says_what_it_does(tmp_path):
    """The bar before the daemon knows the totals: a phase name, not `0/? bytes ?`."""
    script = (
        "import time\n"
        "from avafs.control.progress import WarmupProgress\n"
        "state = dict(id=1, state='planning', tier='disk', files_total=0, bytes_total=0,\n"
        "             files_done=0, bytes_done=0, files_already_cached=0,\n"
        "             bytes_already_cached=0, files_skipped_for_space=0,\n"
        "             bytes_skipped_for_space=0, files_failed=0)\n"
        "with WarmupProgress() as progress:\n"
        "    progress.update(state)\n"
        "    progress.update(state, final=True)\n")
    screen = rendered([sys.executable, "-c", script])
    assert screen.startswith("listing") and "listing files and checking what is cached" in screen
    assert "?" not in screen and "0/" not in screen


def test_foreground_logs_to_stderr_without_a_terminal(local_bucket, tmp_path):
    """As a container's or a service's main process: stderr is a file, not a terminal, and
    must carry the log; a background mount keeps it in the cache dir's avafs.log only."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as stderr:
        daemon = subprocess.Popen(AVAFS + ["mount", "--foreground", local_bucket.as_uri(),
                                           str(mnt), "--cache-dir", str(tmp_path / "fg")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while not is_mounted(mnt):
            assert daemon.poll() is None and time.monotonic() < deadline, \
                stderr_path.read_text()
            time.sleep(0.05)
        assert run_avafs("umount", str(mnt)).returncode == 0
        assert daemon.wait(timeout=60) == 0
    finally:
        unmount(mnt)
        if daemon.poll() is None:
            daemon.kill()
    logged = stderr_path.read_text()
    assert f"INFO avafs: mounted {local_bucket.as_uri()} at {mnt}" in logged
    assert f"INFO avafs: unmounted {mnt}" in logged

    background = run_avafs("mount", local_bucket.as_uri(), str(mnt),
                           "--cache-dir", str(tmp_path / "bg"))
    try:
        assert background.returncode == 0 and background.stderr == ""
    finally:
        unmount(mnt)
    assert f"INFO avafs: mounted {local_bucket.as_uri()} at {mnt}" in \
        (tmp_path / "bg" / "avafs.log").read_text()
