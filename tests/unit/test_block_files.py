"""Block files written with O_DIRECT: exact bytes whatever the length, shared buffers never
mixed up between threads, and a file system that refuses O_DIRECT still gets its blocks."""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor

from avafs.objects import BlockId
from avafs.tiers.block_files import DIRECT_MIN_SIZE, BlockFileWriter
from avafs.tiers.disk import DiskTier

MIB = 1024 * 1024


def _takes_o_direct(folder) -> bool:
    try:
        os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError as error:
        assert error.errno == errno.EINVAL, error
        return False
    (folder / "probe").unlink()
    return True


def test_a_block_of_unaligned_length_is_written_exactly(tmp_path):
    writer = BlockFileWriter()
    for size in (DIRECT_MIN_SIZE, 4 * MIB, 3 * MIB + 1234, DIRECT_MIN_SIZE - 1, 10):
        data = os.urandom(size)
        path = tmp_path / f"block-{size}"
        writer.write(path, data)
        assert path.read_bytes() == data
    assert writer._direct == _takes_o_direct(tmp_path), \
        "large blocks go direct exactly where the file system takes O_DIRECT"


def test_threads_sharing_the_buffers_each_write_their_own_bytes(tmp_path):
    writer = BlockFileWriter(buffers=2)
    blocks = {tmp_path / f"block-{index}": os.urandom(MIB + index * 4097) for index in range(16)}

    with ThreadPoolExecutor(8) as threads:
        list(threads.map(lambda item: writer.write(*item), blocks.items()))

    for path, data in blocks.items():
        assert path.read_bytes() == data


def test_a_file_system_refusing_o_direct_gets_buffered_writes(tmp_path, monkeypatch):
    real_open = os.open
    direct_opens = []

    def open_refusing_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            direct_opens.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_refusing_direct)
    writer = BlockFileWriter()
    first, second = os.urandom(2 * MIB), os.urandom(2 * MIB + 5)

    writer.write(tmp_path / "first", first)
    writer.write(tmp_path / "second", second)

    assert (tmp_path / "first").read_bytes() == first
    assert (tmp_path / "second").read_bytes() == second
    assert len(direct_opens) == 1, "after one refusal the writer stops trying"


def test_the_disk_tier_serves_a_direct_written_block_after_a_remount(tmp_path):
    block = BlockId("file:///bucket", "data", "etag", 0)
    data = os.urandom(4 * MIB - 100)
    tier = DiskTier(tmp_path, 64 * MIB, 1000, 0.9, 0.7)
    tier.put(block, data)
    tier.close()

    tier = DiskTier(tmp_path, 64 * MIB, 1000, 0.9, 0.7)
    try:
        assert tier.get(block) == data, "size and CRC match what was written"
    finally:
        tier.close()
