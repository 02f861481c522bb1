"""Writing through real mounts: POSIX behaviour, durability, upload, faults and crashes."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sample_data import payload, sha256
from support import object_gets, run_avafs, store_bytes, store_keys, unmount

from avafs.client import Client
from avafs.config.cache_dir import WRITEBACK_DIR
from avafs.host.processes import wait_for_exit

MiB = 2**20


def crash_and_remount(s3_mount, mnt: Path, *args: str) -> Path:
    """Kill the mount's daemon (SIGKILL: nothing flushed, nothing said goodbye to) and mount
    again with `args` on the same mountpoint and cache dir, as after a crash."""
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    unmount(mnt)
    return s3_mount(*args, mountpoint=mnt)


def test_large_sequential_write_round_trip(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    data = payload(1, 70 * MiB + 17)
    with open(mnt / "ckpt.pt", "wb") as file:
        for offset in range(0, len(data), 1 << 20):
            file.write(data[offset:offset + (1 << 20)])
    assert sha256((mnt / "ckpt.pt").read_bytes()) == sha256(data)
    assert run_avafs("flush", str(mnt)).returncode == 0
    assert sha256(store_bytes(s3_server, bucket, "ckpt.pt")) == sha256(data)
    assert sha256((mnt / "ckpt.pt").read_bytes()) == sha256(data)
    assert os.stat(mnt / "ckpt.pt").st_size == len(data)


def test_a_written_file_stays_cached_once_the_store_has_it(s3_server, bucket, s3_mount,
                                                          tmp_path):
    """Reading back what was written (a log, a small checkpoint) is a cache hit once it is
    uploaded, on the same mount and after a remount, without a GET; the write-back keeps no
    file behind. A file of more than one block is not kept: it would have to be copied."""
    mnt = s3_mount("--block-size", "1MiB")
    small, large = payload(5, 300 * 1024 + 7), payload(6, 3 * MiB)
    (mnt / "log.txt").write_bytes(small)
    (mnt / "ckpt.bin").write_bytes(large)
    client = Client(mnt)
    client.flush()
    assert client.check([mnt / "log.txt"])["bytes_cached"] == len(small)
    assert client.check([mnt / "ckpt.bin"])["bytes_cached"] == 0
    assert list((tmp_path / "cache" / WRITEBACK_DIR / "data").iterdir()) == []

    unmount(mnt)
    again = s3_mount("--block-size", "1MiB", mountpoint=mnt)
    gets = object_gets(s3_server, bucket)
    assert (again / "log.txt").read_bytes() == small
    assert object_gets(s3_server, bucket) == gets
    assert (again / "ckpt.bin").read_bytes() == large


def test_a_written_file_held_open_when_it_settles_is_not_kept(s3_server, bucket, s3_mount,
                                                             tmp_path):
    """Only a data file nothing else holds may become a cached block: a handle still open on
    it (here a reader; a file unlinked while open may even be written again through
    /proc/PID/fd) could change what the block would claim to be. It goes at the last close,
    and the next read is the store's."""
    mnt = s3_mount("--block-size", "1MiB", "--writeback-delay", "3600")
    data = payload(7, 200 * 1024)
    (mnt / "held.bin").write_bytes(data)
    with open(mnt / "held.bin", "rb") as held:
        Client(mnt).flush()
        assert held.read() == data
    assert Client(mnt).check([mnt / "held.bin"])["bytes_cached"] == 0
    assert list((tmp_path / "cache" / WRITEBACK_DIR / "data").iterdir()) == []


def test_names_that_need_escaping_round_trip_through_the_store(s3_server, bucket, s3_mount):
    """Object keys go into signed request URLs: spaces, '+', '%', '=', '&', '?', '#' and
    non-ASCII must reach the store as written and read back from it."""
    names = ["a b.bin", "ü+%~.bin", "x=y&z?q#h.bin"]
    mnt = s3_mount()
    (mnt / "odd dir").mkdir()
    for number, name in enumerate(names):
        (mnt / "odd dir" / name).write_bytes(payload(80 + number, 3000))
    Client(mnt).flush()
    for number, name in enumerate(names):
        assert store_bytes(s3_server, bucket, f"odd dir/{name}") == payload(80 + number, 3000)
    reader = s3_mount(mountpoint=mnt.parent / "reader", cache_dir=mnt.parent / "reader-cache")
    assert sorted(os.listdir(reader / "odd dir")) == sorted(names)
    for number, name in enumerate(names):
        assert (reader / "odd dir" / name).read_bytes() == payload(80 + number, 3000)


def test_random_4k_writes_over_an_existing_object(s3_server, bucket, s3_mount):
    original = payload(2, 8 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="big.bin", Body=original)
    mnt = s3_mount("--block-size", "1MiB")
    model = bytearray(original)
    rng = random.Random(3)
    with open(mnt / "big.bin", "r+b") as file:
        for _ in range(300):
            offset = rng.randrange(0, len(model) - 4096) // 4096 * 4096
            chunk = os.urandom(4096)
            file.seek(offset)
            file.write(chunk)
            model[offset:offset + 4096] = chunk
    assert (mnt / "big.bin").read_bytes() == bytes(model)
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "big.bin") == bytes(model)


def test_append_and_truncate(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    path = mnt / "log.txt"
    with open(path, "a") as file:
        file.write("one\n")
    with open(path, "a") as file:
        file.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    os.truncate(path, 3)
    assert path.read_bytes() == b"one"
    os.truncate(path, 10)
    assert path.read_bytes() == b"one" + b"\0" * 7
    with open(path, "r+b") as file:
        file.truncate(5)
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "log.txt") == b"one\0\0"


def test_posix_namespace_operations(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    (mnt / "d" / "e").mkdir(parents=True)
    (mnt / "d" / "e" / "f.txt").write_text("f")
    with pytest.raises(OSError) as error:
        os.rmdir(mnt / "d")
    assert error.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as error:
        os.link(mnt / "d" / "e" / "f.txt", mnt / "hard")
    assert error.value.errno == errno.ENOTSUP
    os.rename(mnt / "d" / "e" / "f.txt", mnt / "g.txt")
    assert (mnt / "g.txt").read_text() == "f"
    os.rmdir(mnt / "d" / "e")
    os.unlink(mnt / "g.txt")
    assert sorted(os.listdir(mnt)) == ["d"]
    Client(mnt).flush()
    assert store_keys(s3_server, bucket) == {"d/"}
    stats = os.statvfs(mnt)
    assert stats.f_blocks * stats.f_frsize == 10 * 2**30


def test_rename_of_a_directory_of_1000_files(s3_server, bucket, s3_mount):
    client = s3_server.client()
    files = {f"run/{i:04d}.txt": f"sample {i}".encode() for i in range(1000)}
    for key, data in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
    client.put_object(Bucket=bucket, Key="run/sub/inner.txt", Body=b"inner")
    mnt = s3_mount()
    os.rename(mnt / "run", mnt / "renamed")
    assert os.listdir(mnt) == ["renamed"]
    assert len(os.listdir(mnt / "renamed")) == 1001
    assert (mnt / "renamed" / "0999.txt").read_bytes() == b"sample 999"
    Client(mnt).flush()
    keys = store_keys(s3_server, bucket)
    assert not {key for key in keys if key.startswith("run/")}
    for key, data in files.items():
        assert store_bytes(s3_server, bucket, "renamed/" + key[4:]) == data
    assert store_bytes(s3_server, bucket, "renamed/sub/inner.txt") == b"inner"


def test_concurrent_writers_to_different_files(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    errors: list[Exception] = []

    def writer(number: int) -> None:
        try:
            with open(mnt / f"w{number}.bin", "wb") as file:
                for part in range(20):
                    file.write(payload(number * 100 + part, 64 * 1024))
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    Client(mnt).flush()
    for number in range(8):
        expected = b"".join(payload(number * 100 + part, 64 * 1024) for part in range(20))
        assert store_bytes(s3_server, bucket, f"w{number}.bin") == expected


def test_sqlite_database_on_the_mount(s3_server, bucket, s3_mount, tmp_path):
    mnt = s3_mount()
    database = sqlite3.connect(mnt / "metrics.db")
    database.execute("create table steps (step integer primary key, loss real)")
    for step in range(2000):
        database.execute("insert into steps values (?, ?)", (step, 1.0 / (step + 1)))
        if step % 500 == 0:
            database.commit()
    database.commit()
    assert database.execute("pragma integrity_check").fetchone() == ("ok",)
    database.close()
    Client(mnt).flush()
    copy = tmp_path / "copy.db"
    copy.write_bytes(store_bytes(s3_server, bucket, "metrics.db"))
    restored = sqlite3.connect(copy)
    assert restored.execute("pragma integrity_check").fetchone() == ("ok",)
    assert restored.execute("select count(*) from steps").fetchone() == (2000,)


def test_writeback_sync_uploads_before_close_returns(s3_server, bucket, s3_mount):
    mnt = s3_mount("--writeback", "sync")
    (mnt / "now.txt").write_bytes(b"durable in the store at close")
    assert store_bytes(s3_server, bucket, "now.txt") == b"durable in the store at close"


def test_writeback_sync_keeps_writes_made_after_an_fsync(s3_server, bucket, s3_mount):
    """fsync() uploads an open file in sync mode; what the writer adds afterwards is kept and
    uploaded too (it used to be dropped: the upload settled the file while it was open)."""
    mnt = s3_mount("--writeback", "sync")
    with open(mnt / "log.txt", "wb") as file:
        file.write(b"first ")
        file.flush()
        os.fsync(file.fileno())
        assert store_bytes(s3_server, bucket, "log.txt") == b"first "
        file.write(b"second")
        file.flush()
        assert (mnt / "log.txt").read_bytes() == b"first second"
    assert store_bytes(s3_server, bucket, "log.txt") == b"first second"
    assert (mnt / "log.txt").read_bytes() == b"first second"
    Client(mnt).flush()
    assert Client(mnt).status()["dirty"]["files"] == 0


def test_umount_flushes_and_no_flush_resumes_at_next_mount(s3_server, bucket, s3_mount,
                                                          tmp_path):
    mnt = s3_mount("--writeback-delay", "30")
    (mnt / "a.txt").write_bytes(b"flushed by umount")
    result = run_avafs("umount", str(mnt))
    assert result.returncode == 0, result.stderr
    assert store_bytes(s3_server, bucket, "a.txt") == b"flushed by umount"

    mnt = s3_mount("--writeback-delay", "30", mountpoint=mnt)
    (mnt / "b.txt").write_bytes(b"left journaled")
    assert run_avafs("umount", "--no-flush", str(mnt)).returncode == 0
    assert "b.txt" not in store_keys(s3_server, bucket)
    mnt = s3_mount(mountpoint=mnt)
    assert (mnt / "b.txt").read_bytes() == b"left journaled"
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "b.txt") == b"left journaled"


@pytest.mark.parametrize("mode, seconds", [("503", 30), ("refuse", 10)])
def test_store_failing_during_uploads_loses_nothing(s3_server, bucket, s3_mount, proxy, mode,
                                                    seconds):
    mnt = s3_mount(endpoint=proxy.endpoint)
    (mnt / "out").mkdir()
    assert os.listdir(mnt / "out") == []
    proxy.mode = mode
    started = time.monotonic()
    files = {f"out/{i}.bin": payload(50 + i, 300_000) for i in range(10)}
    for key, data in files.items():
        (mnt / key).write_bytes(data)
    for key, data in files.items():
        assert (mnt / key).read_bytes() == data
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    status = Client(mnt).status()
    assert status["dirty"]["files"] == 10 and status["dirty"]["upload_queue"] == 11
    assert not store_keys(s3_server, bucket, "out/")
    proxy.mode = "pass"
    Client(mnt).flush()
    for key, data in files.items():
        assert store_bytes(s3_server, bucket, key) == data


def test_crash_loop_keeps_every_fsynced_byte(s3_server, bucket, tmp_path, s3_env):
    rng = random.Random(11)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    cache = tmp_path / "cache"
    acknowledged: dict[str, bytes] = {}
    base = ["mount", f"s3://{bucket}", str(mountpoint), "--endpoint-url", s3_server.endpoint,
            "--cache-dir", str(cache), "--writeback-delay", "0"]
    try:
        for round_number in range(20):
            assert run_avafs(*base).returncode == 0
            pid = int(os.getxattr(mountpoint, "user.avafs.pid"))
            killer = threading.Timer(rng.uniform(0.05, 0.6), os.kill, (pid, 9))
            killer.start()
            with contextlib.suppress(OSError):  # the kill lands mid-write: expected
                for part in range(50):
                    key = f"r{round_number:02d}/{part}.bin"
                    data = payload(round_number * 1000 + part, rng.randrange(1, 200_000))
                    os.makedirs(mountpoint / key.split("/")[0], exist_ok=True)
                    fd = os.open(mountpoint / key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    try:
                        os.write(fd, data)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    acknowledged[key] = data
            killer.join()
            wait_for_exit(pid, 30)
            unmount(mountpoint)
        assert run_avafs(*base).returncode == 0
        Client(mountpoint).flush()
    finally:
        unmount(mountpoint)
    assert acknowledged
    for key, data in acknowledged.items():
        assert store_bytes(s3_server, bucket, key) == data, key


def test_full_disk_tier_applies_back_pressure(s3_server, bucket, s3_mount):
    mnt = s3_mount("--disk-cache", "8MiB", "--block-size", "1MiB", "--writeback-delay", "5")
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        client = Client(mnt)
        while not stop.is_set():
            peak = max(peak, client.status()["dirty"]["bytes"])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(24):
            (mnt / f"{i}.bin").write_bytes(payload(i, MiB))
    finally:
        stop.set()
        watcher.join()
    assert peak <= 8 * MiB
    Client(mnt).flush()
    for i in range(24):
        assert store_bytes(s3_server, bucket, f"{i}.bin") == payload(i, MiB)


def test_local_bucket_round_trip(local_bucket, mount):
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "0")
    (mnt / "dir").mkdir()
    (mnt / "dir" / "f.txt").write_text("local")
    Client(mnt).flush()
    assert (local_bucket / "dir" / "f.txt").read_text() == "local"
    assert oct((local_bucket / "dir" / "f.txt").stat().st_mode & 0o777) == "0o644"


def test_daemon_killed_with_unflushed_file_then_remount_serves_journal(s3_server, bucket,
                                                                       s3_mount, tmp_path):
    mnt = s3_mount("--writeback-delay", "3600")
    (mnt / "keep.txt").write_bytes(b"acknowledged by close")
    mnt = crash_and_remount(s3_mount, mnt, "--writeback-delay", "3600")
    assert (mnt / "keep.txt").read_bytes() == b"acknowledged by close"
    assert Client(mnt).status()["dirty"]["files"] == 1
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "keep.txt") == b"acknowledged by close"


def test_writes_after_an_fsync_are_committed_by_close_and_survive_a_crash(s3_server, bucket,
                                                                          s3_mount):
    """What a writer adds after an fsync is durable at close like what came before it, and a
    file closed unchanged after its fsync stays as synced: a crash right after loses none."""
    mnt = s3_mount("--writeback-delay", "3600")
    with open(mnt / "log.txt", "wb") as file:
        file.write(b"before the fsync, ")
        file.flush()
        os.fsync(file.fileno())
        os.fsync(file.fileno())
        file.write(b"after it")
    with open(mnt / "synced.txt", "wb") as file:
        file.write(b"synced, then closed unchanged")
        file.flush()
        os.fsync(file.fileno())

    mnt = crash_and_remount(s3_mount, mnt, "--writeback-delay", "3600")
    assert (mnt / "log.txt").read_bytes() == b"before the fsync, after it"
    assert (mnt / "synced.txt").read_bytes() == b"synced, then closed unchanged"
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "log.txt") == b"before the fsync, after it"
    assert store_bytes(s3_server, bucket, "synced.txt") == b"synced, then closed unchanged"
