"""Reading through real mounts of a file:// directory and of an S3 bucket on moto's server."""

from __future__ import annotations

import hashlib
import os
import random
import stat
import threading
import time
from pathlib import Path

import pytest
from sample_data import Bucket, payload, sha256

from avafs.client import Client
from avafs.tiers.streams import STREAM_PIECE

MiB = 2**20


@pytest.fixture(params=["file", "s3"])
def source(request, tmp_path) -> Bucket:
    if request.param == "file":
        root = tmp_path / "bucket"
        root.mkdir()
        return Bucket(root.as_uri(), [], local_root=root)
    server = request.getfixturevalue("s3_server")
    name = request.getfixturevalue("bucket")
    return Bucket(f"s3://{name}", ["--endpoint-url", server.endpoint],
                  s3_client=server.client(), s3_bucket=name)


def gets(server, bucket: str) -> list[str]:
    return [line for line in server.requests() if line.startswith(f"GET /{bucket}/")
            and "list-type" not in line and "prefix=" not in line]


def test_large_file_is_bit_exact(source, mount):
    data = payload(1, 9 * MiB + 12345)
    source.put("data/large.bin", data)
    mnt = mount(source.url, *source.mount_args, "--block-size", "1MiB")
    assert sha256((mnt / "data" / "large.bin").read_bytes()) == sha256(data)
    assert os.stat(mnt / "data" / "large.bin").st_size == len(data)


@pytest.mark.parametrize(("blocks", "expected_gets"), [(14, 1), (20, 2)])
def test_a_sequential_read_takes_a_short_tail_with_its_first_stream(s3_server, bucket, mount,
                                                                   blocks, expected_gets):
    """The default window is 8 blocks: a tail of 6 more joins the first stream; 12 more
    do not, and come with the second, doubled window. Blocks of 512 KiB, so that a stream
    of up to 16 of them is one GET (a stream goes in pieces of STREAM_PIECE bytes)."""
    block = MiB // 2
    assert 16 * block <= STREAM_PIECE
    data = payload(3, (blocks - 1) * block + 5)
    s3_server.client().put_object(Bucket=bucket, Key="seq.bin", Body=data)
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size",
                "512KiB")
    before = len(gets(s3_server, bucket))

    assert sha256((mnt / "seq.bin").read_bytes()) == sha256(data)
    assert len(gets(s3_server, bucket)) - before == expected_gets


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's read-ahead knob needs root")
def test_kernel_reads_ahead_a_whole_block(local_bucket, mount):
    mnt = mount(local_bucket.as_uri(), "--block-size", "2MiB")
    device = os.stat(mnt).st_dev
    knob = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
    assert knob.read_text().strip() == "2048"


def test_random_and_ranged_reads_at_block_boundaries(source, mount):
    block = 256 * 1024
    data = payload(2, 5 * block + 777)
    source.put("ranged.bin", data)
    mnt = mount(source.url, *source.mount_args, "--block-size", str(block), "--read-ahead", "0")
    rng = random.Random(7)
    ranges = [(b * block + delta, size) for b in range(6) for delta in (-1, 0, 1)
              for size in (1, 2, 4096, block, block + 3) if b * block + delta >= 0]
    ranges += [(rng.randrange(len(data)), rng.randrange(1, 3 * block)) for _ in range(50)]
    ranges.append((len(data) - 10, 100))
    ranges.append((len(data) + 10, 100))
    rng.shuffle(ranges)
    fd = os.open(mnt / "ranged.bin", os.O_RDONLY)
    try:
        for offset, size in ranges:
            assert os.pread(fd, size, offset) == data[offset:offset + size], (offset, size)
    finally:
        os.close(fd)


def test_2000_small_files_in_one_prefix(source, mount):
    files = {f"small/{i:05d}.bin": payload(i, 1000 + i) for i in range(2000)}
    source.put_many(files)
    mnt = mount(source.url, *source.mount_args)
    names = sorted(os.listdir(mnt / "small"))
    assert names == sorted(key.split("/")[1] for key in files)
    for key, data in files.items():
        assert (mnt / key).read_bytes() == data


def test_implicit_and_marker_directories(source, mount):
    source.put("a/b/c/deep.txt", b"deep")
    source.put("a/top.txt", b"top")
    if source.local_root is None:
        source.put("marked/", b"")
        source.put("marked/inside.txt", b"inside")
        source.put("empty-marker/", b"")
    mnt = mount(source.url, *source.mount_args)
    assert (mnt / "a" / "b" / "c" / "deep.txt").read_bytes() == b"deep"
    assert sorted(os.listdir(mnt / "a")) == ["b", "top.txt"]
    assert (mnt / "a" / "b").is_dir()
    if source.local_root is None:
        assert sorted(os.listdir(mnt / "marked")) == ["inside.txt"]
        assert (mnt / "empty-marker").is_dir() and os.listdir(mnt / "empty-marker") == []
    assert not (mnt / "a" / "missing").exists()


def test_keys_that_cannot_be_paths_are_hidden(s3_server, bucket, mount, tmp_path):
    client = s3_server.client()
    for key in ("ok/fine.txt", "ok//double.txt", "ok/../escape.txt", "ok/./dot.txt",
                "x" * 300, "file-and-dir", "file-and-dir/child.txt"):
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint)
    assert sorted(os.listdir(mnt)) == ["file-and-dir", "ok"]
    assert os.listdir(mnt / "ok") == ["fine.txt"]
    assert (mnt / "file-and-dir").is_dir()
    log = (tmp_path / "cache" / "avafs.log").read_text()
    for hidden in ("'ok//'", "'ok/../'", "'ok/./'", "'" + "x" * 300 + "'"):
        assert log.count(hidden) == 1, hidden
    os.listdir(mnt / "ok")
    assert log.count("'ok//'") == 1


def test_two_sources_in_one_namespace(s3_server, bucket, s3_env, mount, tmp_path):
    s3_server.client().put_object(Bucket=bucket, Key="train/x.bin", Body=b"from-s3")
    local = tmp_path / "local"
    (local / "logs").mkdir(parents=True)
    (local / "logs" / "y.txt").write_bytes(b"from-disk")
    config = tmp_path / "avafs.yaml"
    config.write_text(f"namespace:\n  datasets: s3://{bucket}\n  scratch: {local.as_uri()}\n"
                      f"endpoint_url: {s3_server.endpoint}\nmetadata_ttl: inf\n")
    mnt = mount("--config", str(config))
    assert sorted(os.listdir(mnt)) == ["datasets", "scratch"]
    assert (mnt / "datasets" / "train" / "x.bin").read_bytes() == b"from-s3"
    assert (mnt / "scratch" / "logs" / "y.txt").read_bytes() == b"from-disk"
    assert sorted(Client(mnt).list_files(mnt)) == [str(mnt / "datasets" / "train" / "x.bin"),
                                                   str(mnt / "scratch" / "logs" / "y.txt")]


def test_second_read_sends_no_get(s3_server, bucket, mount):
    data = payload(3, 6 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="epoch.bin", Body=data)
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size", "1MiB")
    assert (mnt / "epoch.bin").read_bytes() == data
    first = len(gets(s3_server, bucket))
    assert 1 <= first <= 6
    os.posix_fadvise(os.open(mnt / "epoch.bin", os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    for _ in range(2):
        assert (mnt / "epoch.bin").read_bytes() == data
    assert len(gets(s3_server, bucket)) == first


def test_disk_tier_is_reused_after_remount(s3_server, bucket, mount, tmp_path):
    data = {f"f{i}.bin": payload(10 + i, 300_000) for i in range(5)}
    client = s3_server.client()
    for key, value in data.items():
        client.put_object(Bucket=bucket, Key=key, Body=value)
    args = ("--endpoint-url", s3_server.endpoint, "--ram-cache", "0")
    mnt = mount(f"s3://{bucket}", *args)
    for key, value in data.items():
        assert (mnt / key).read_bytes() == value
    before = len(gets(s3_server, bucket))
    assert before == 5
    from support import unmount

    unmount(mnt)
    mnt = mount(f"s3://{bucket}", *args, mountpoint=mnt)
    for key, value in data.items():
        assert (mnt / key).read_bytes() == value
    assert len(gets(s3_server, bucket)) == before


MODES = pytest.mark.parametrize("mode", [(), ("--read-only",)], ids=["read-write", "read-only"])
"""A read-only mount opens no files where pyfuse3 allows it (`AvafsOperations._opens`), so what
decides when a reader sees a new version differs from a read-write mount's."""


@MODES
def test_changed_etag_is_reread(source, mount, mode):
    source.put("model.txt", b"version one")
    mnt = mount(source.url, *source.mount_args, "--metadata-ttl", "0", *mode)
    assert (mnt / "model.txt").read_bytes() == b"version one"
    source.put("model.txt", b"version two, longer")
    if source.local_root is not None:
        os.utime(source.local_root / "model.txt", ns=(1, 1))
    assert (mnt / "model.txt").read_bytes() == b"version two, longer"


@MODES
def test_a_file_replaced_by_one_of_the_same_size_and_mtime_is_reread(local_bucket, mount,
                                                                     mode):
    """The kernel drops a file's cached pages by itself only when its size or mtime changed."""
    path = local_bucket / "shard.bin"
    path.write_bytes(payload(1, 200_000))
    mnt = mount(local_bucket.as_uri(), "--metadata-ttl", "1", *mode)
    assert (mnt / "shard.bin").read_bytes() == payload(1, 200_000)
    mtime = path.stat().st_mtime_ns
    replacement = local_bucket / "shard.tmp"
    replacement.write_bytes(payload(2, 200_000))
    os.utime(replacement, ns=(mtime, mtime))
    replacement.rename(path)
    time.sleep(1.5)
    assert (mnt / "shard.bin").read_bytes() == payload(2, 200_000)


def test_a_walk_shows_what_the_store_has_once_the_listing_is_fetched_again(source, mount):
    """Attributes built for one readdir are reused by the next ones, until the listing that
    described the file is fetched again."""
    for name in ("a.bin", "b.bin"):
        source.put(f"d/{name}", b"x" * 10)
    mnt = mount(source.url, *source.mount_args, "--metadata-ttl", "1")

    def sizes() -> dict[str, int]:
        return {entry.name: entry.stat().st_size for entry in os.scandir(mnt / "d")}

    assert sizes() == sizes() == {"a.bin": 10, "b.bin": 10}
    source.put("d/a.bin", b"y" * 30)
    if source.local_root is not None:
        os.utime(source.local_root / "d" / "a.bin", ns=(1, 1))
    deadline = time.monotonic() + 10
    while sizes()["a.bin"] != 30:
        assert time.monotonic() < deadline, "the new size never showed"
        time.sleep(0.2)
    assert sizes() == {"a.bin": 30, "b.bin": 10}
    assert (mnt / "d" / "a.bin").read_bytes() == b"y" * 30


def _listed(directory: Path) -> dict[str, int]:
    """Each entry's name and the inode its directory entry names, checked against its stat."""
    entries = {entry.name: entry.inode() for entry in os.scandir(directory)}
    for name, inode in entries.items():
        assert os.stat(directory / name).st_ino == inode, name
    return entries


def test_a_directory_read_again_shows_every_change(source, mount):
    """The kernel keeps a directory's entries once it has read them all (`DirectoryRequests.opendir`):
    changes in the store show once the listing is fetched again, changes through the mount at
    once, and an entry whose inode the kernel forgot is listed with the inode it has now."""
    for name in ("a.bin", "b.bin"):
        source.put(f"d/{name}", b"x")
    mnt = mount(source.url, *source.mount_args, "--metadata-ttl", "1")
    assert sorted(_listed(mnt / "d")) == sorted(_listed(mnt / "d")) == ["a.bin", "b.bin"]

    source.put("d/c.bin", b"x")
    source.delete("d/a.bin")
    deadline = time.monotonic() + 10
    while sorted(_listed(mnt / "d")) != ["b.bin", "c.bin"]:
        assert time.monotonic() < deadline, "the store's changes never showed"
        time.sleep(0.2)

    (mnt / "d" / "new.bin").write_bytes(b"y")
    assert sorted(_listed(mnt / "d")) == ["b.bin", "c.bin", "new.bin"]
    (mnt / "d" / "new.bin").rename(mnt / "d" / "renamed.bin")
    assert sorted(_listed(mnt / "d")) == ["b.bin", "c.bin", "renamed.bin"]
    (mnt / "d" / "renamed.bin").unlink()
    (mnt / "d" / "sub").mkdir()
    assert sorted(_listed(mnt / "d")) == ["b.bin", "c.bin", "sub"]

    held = os.open(mnt / "d", os.O_RDONLY)  # keeps the directory's inode, and its entries
    try:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("2")  # forgets the unused inodes
        except OSError:
            return  # not root: nothing makes the kernel forget inodes on demand
        assert sorted(_listed(mnt / "d")) == ["b.bin", "c.bin", "sub"]
    finally:
        os.close(held)


def test_immutable_mount_never_revalidates(s3_server, bucket, mount):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="frozen.txt", Body=b"same")
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--immutable")
    assert (mnt / "frozen.txt").read_bytes() == b"same"
    requests = len(s3_server.requests())
    for _ in range(3):
        assert (mnt / "frozen.txt").read_bytes() == b"same"
        os.listdir(mnt)
    assert len(s3_server.requests()) == requests


def _usage(directory: Path) -> int:
    """Bytes allocated to the files under `directory`; the daemon's evictor may unlink a
    file between the listing and its stat, and such a file counts for nothing."""
    total = 0
    for path in directory.rglob("*"):
        try:
            status = os.stat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(status.st_mode):
            total += status.st_blocks * 512
    return total


def test_disk_usage_stays_under_cap_for_three_times_the_cache(source, mount, tmp_path):
    cap = 4 * MiB
    block = 256 * 1024
    files = {f"epoch/{i:02d}.bin": payload(100 + i, 700_000) for i in range(18)}
    source.put_many(files)
    mnt = mount(source.url, *source.mount_args, "--disk-cache", str(cap), "--ram-cache", "1MiB",
                "--block-size", str(block), "--read-ahead", "2")
    blocks_dir = tmp_path / "cache" / "disk" / "blocks"
    peak = 0
    for _ in range(2):
        for key, data in files.items():
            assert sha256((mnt / key).read_bytes()) == sha256(data)
            peak = max(peak, _usage(blocks_dir))
    assert 0 < peak <= cap + block


def test_concurrent_readers_share_fetches(s3_server, bucket, mount):
    data = payload(5, 8 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="shared.bin", Body=data)
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size", "1MiB")
    digests: list[str] = []

    def reader() -> None:
        with open(mnt / "shared.bin", "rb") as file:
            digest = hashlib.sha256()
            while chunk := file.read(100_000):
                digest.update(chunk)
        digests.append(digest.hexdigest())

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert digests == [sha256(data)] * 8
    assert 1 <= len(gets(s3_server, bucket)) <= 8
    from avafs.client import Client

    assert Client(mnt).status()["misses"] == 8


@pytest.mark.parametrize("mode", ["503", "refuse", "cut"])
def test_reads_recover_from_store_faults(s3_server, bucket, mount, proxy, mode):
    data = payload(9, 3 * MiB + 5)
    s3_server.client().put_object(Bucket=bucket, Key="f.bin", Body=data)
    mnt = mount(f"s3://{bucket}", "--endpoint-url", proxy.endpoint, "--block-size", "1MiB")
    assert os.listdir(mnt) == ["f.bin"]
    proxy.mode = mode
    result: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: result.setdefault("data", (mnt / "f.bin").read_bytes()))
    reader.start()
    time.sleep(2)
    proxy.mode = "pass"
    reader.join(timeout=60)
    assert result["data"] == data


def test_read_only_mount_refuses_writes_with_erofs(source, mount):
    source.put("ro.txt", b"read only")
    mnt = mount(source.url, *source.mount_args, "--read-only")
    for action in (lambda: os.open(mnt / "new.txt", os.O_WRONLY | os.O_CREAT),
                   lambda: os.open(mnt / "ro.txt", os.O_WRONLY | os.O_APPEND),
                   lambda: os.mkdir(mnt / "d"), lambda: os.unlink(mnt / "ro.txt")):
        with pytest.raises(OSError) as error:
            action()
        assert error.value.errno == 30  # EROFS
    assert (mnt / "ro.txt").read_bytes() == b"read only"


def test_read_only_mount_closes_and_fsyncs_read_files(local_bucket, mount):
    """A read-only mount answers FLUSH with ENOSYS so that the kernel stops sending it: the
    reader must still see every close (and fsync) succeed, the first one included."""
    contents = {f"f{index}.bin": payload(index, 1000) for index in range(3)}
    for name, data in contents.items():
        (local_bucket / name).write_bytes(data)
    mnt = mount(local_bucket.as_uri(), "--read-only")
    for name, data in contents.items():
        fd = os.open(mnt / name, os.O_RDONLY)
        try:
            assert os.read(fd, 4096) == data
            os.fsync(fd)
        finally:
            os.close(fd)
