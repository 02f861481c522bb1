"""Sample formats: one file per sample, WebDataset-style tar shards, and TFRecord shards.

All three are read as "units" holding a known number of samples, so the splitting arithmetic is
the same for each: a plain file is a unit with one sample. Shards are read sequentially, because
object storage and the mount's read-ahead reward streaming, and a reader resuming mid-shard skips
samples by their headers without reading their bodies.

TFRecord framing (TensorFlow's `record_writer.cc`): uint64 length, uint32 masked CRC-32C of the
length bytes, the data, uint32 masked CRC-32C of the data, all little-endian. Both CRCs are
verified by default, with the C implementation of CRC-32C (`google-crc32c`), because a truncated
or corrupt shard must fail loudly rather than feed garbage to a model.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import struct
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import google_crc32c

from adapters.errors import ShardFormatError
from adapters.sources import Item

if TYPE_CHECKING:
    from avafs.client import Client

log = logging.getLogger(__name__)

READ_BUFFER = 1 << 20
FILE_BATCH = 32
"""One-file samples asked of the mount's daemon per request: enough to spread a round trip
over many samples, few enough that a reader holds little more than one DataLoader batch."""
_TFRECORD_HEADER = struct.Struct("<QI")
_TFRECORD_FOOTER = struct.Struct("<I")
_CRC_MASK_DELTA = 0xA282EAD8
_WEBDATASET_NAME = re.compile(r"^((?:.*/)?[^./]+)\.([^/]+)$")

Sample = dict[str, Any]


class SampleFormat(enum.Enum):
    FILES = "files"
    TAR = "tar"
    TFRECORD = "tfrecord"

    @property
    def default_suffixes(self) -> tuple[str, ...]:
        return {SampleFormat.FILES: (), SampleFormat.TAR: (".tar",),
                SampleFormat.TFRECORD: (".tfrecord", ".tfrecords")}[self]

    @property
    def is_sharded(self) -> bool:
        return self is not SampleFormat.FILES


def count_samples(fmt: SampleFormat, item: Item) -> int:
    if fmt is SampleFormat.FILES:
        return 1
    if fmt is SampleFormat.TAR:
        return sum(1 for _ in _tar_groups(item.path))
    return sum(1 for _ in _tfrecord_spans(item.path))


def read_samples(fmt: SampleFormat, item: Item, skip: int = 0,
                 limit: int | None = None) -> Iterator[Sample]:
    """Samples of one unit from index `skip` on, at most `limit` of them."""
    if fmt is SampleFormat.FILES:
        if skip == 0 and limit != 0:
            yield read_file_sample(item)
        return
    if fmt is SampleFormat.TAR:
        yield from _tar_samples(item, skip, limit)
    else:
        yield from _tfrecord_samples(item, skip, limit)


def read_file_sample(item: Item) -> Sample:
    """Reads one whole file, unbuffered.

    A buffered open() asks `isatty()`, an ioctl that FUSE forwards to the mount's daemon; on a
    warm mount that round trip was half the cost of reading a small file.
    """
    with open(item.path, "rb", buffering=0) as file:
        return file_sample(item, file.readall())


def file_sample(item: Item, data: bytes) -> Sample:
    return {**item.labels, "__key__": item.key, "__path__": item.path, "data": data}


def read_file_samples(items: Sequence[Item], client: Client | None,
                      before_batch: Callable[[int], None] | None = None) -> Iterator[Sample]:
    """One-file samples in order: through the mount's daemon, a batch per request, when its
    control socket is reachable (FUSE costs four round trips per file, which caps the small
    files a second a mount serves); else, as in a pod that sees the mount but not the
    daemon's socket, file by file. `before_batch(last)` is told the position of a batch's
    last item before the batch is read (prefetch hints then cover what follows it)."""
    for start in range(0, len(items), FILE_BATCH):
        batch = items[start:start + FILE_BATCH]
        if before_batch is not None:
            before_batch(start + len(batch) - 1)
        contents = None
        if client is not None:
            from avafs.client import AvafsError

            try:
                contents = client.read_files([item.path for item in batch])
            except AvafsError as error:
                log.warning("reading samples file by file from now on: %s", error)
                client = None
        if contents is None:
            yield from map(read_file_sample, batch)
        else:
            yield from map(file_sample, batch, contents)


def _tar_samples(item: Item, skip: int, limit: int | None) -> Iterator[Sample]:
    if limit == 0:
        return
    produced = 0
    with open(item.path, "rb", buffering=READ_BUFFER) as file:
        for index, (key, members) in enumerate(_tar_groups(item.path, file)):
            if index < skip:
                continue
            sample: Sample = {**item.labels, "__key__": key, "__shard__": item.key}
            for extension, member in members:
                file.seek(member.offset_data)
                sample[extension] = file.read(member.size)
            yield sample
            produced += 1
            if produced == limit:
                return


def _tar_groups(path: str, file: BinaryIO | None = None
                ) -> Iterator[tuple[str, list[tuple[str, tarfile.TarInfo]]]]:
    """Consecutive members sharing a key (the name up to the basename's first dot) form a sample.

    Only headers are read here; bodies are read by the caller, or skipped. Members whose basename
    has no dot carry no field name and are skipped, as WebDataset does.
    """
    stream = open(path, "rb", buffering=READ_BUFFER) if file is None else file  # noqa: SIM115
    try:
        with tarfile.open(fileobj=stream, mode="r:") as archive:
            key: str | None = None
            members: list[tuple[str, tarfile.TarInfo]] = []
            while (member := archive.next()) is not None:
                archive.members.clear()  # the archive would otherwise keep every header
                match = _WEBDATASET_NAME.match(member.name) if member.isfile() else None
                if match is None:
                    continue
                member_key, extension = match.groups()
                if member_key != key and members:
                    assert key is not None
                    yield key, members
                    members = []
                elif any(extension == seen for seen, _ in members):
                    raise ShardFormatError(
                        f"{path}: sample {member_key!r} has two {extension!r} files")
                key = member_key
                members.append((extension, member))
            if members:
                assert key is not None
                yield key, members
    except tarfile.TarError as error:
        raise ShardFormatError(f"{path}: not a readable tar shard ({error})") from None
    finally:
        if file is None:
            stream.close()


def _tfrecord_samples(item: Item, skip: int, limit: int | None) -> Iterator[Sample]:
    if limit == 0:
        return
    produced = 0
    with open(item.path, "rb", buffering=READ_BUFFER) as file:
        for index, (offset, length) in enumerate(_tfrecord_spans(item.path, file)):
            if index < skip:
                continue
            file.seek(offset)
            data = file.read(length)
            (data_crc,) = _TFRECORD_FOOTER.unpack(file.read(_TFRECORD_FOOTER.size))
            if masked_crc32c(data) != data_crc:
                raise ShardFormatError(f"{item.path}: record {index} at byte "
                                       f"{offset - _TFRECORD_HEADER.size} fails its data CRC")
            yield {**item.labels, "__key__": f"{item.key}:{index}", "__shard__": item.key,
                   "data": data}
            produced += 1
            if produced == limit:
                return


def _tfrecord_spans(path: str, file: BinaryIO | None = None) -> Iterator[tuple[int, int]]:
    """(data offset, data length) of each record, read from the headers alone."""
    stream = open(path, "rb", buffering=READ_BUFFER) if file is None else file  # noqa: SIM115
    try:
        size = os.fstat(stream.fileno()).st_size
        offset = 0
        while offset < size:
            stream.seek(offset)
            header = stream.read(_TFRECORD_HEADER.size)
            if len(header) < _TFRECORD_HEADER.size:
                raise ShardFormatError(f"{path}: truncated record header at byte {offset}")
            length, length_crc = _TFRECORD_HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                raise ShardFormatError(f"{path}: corrupt record header at byte {offset}")
            data_offset = offset + _TFRECORD_HEADER.size
            offset = data_offset + length + _TFRECORD_FOOTER.size
            if offset > size:
                raise ShardFormatError(f"{path}: record at byte {data_offset - 12} is truncated")
            yield data_offset, length
    finally:
        if file is None:
            stream.close()


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def write_tfrecord(path: str | os.PathLike[str], records: Iterable[bytes]) -> int:
    """Writes records in TFRecord framing (uncompressed); returns how many were written."""
    written = 0
    with open(path, "wb") as file:
        for record in records:
            length = struct.pack("<Q", len(record))
            file.write(length + struct.pack("<I", masked_crc32c(length)))
            file.write(record)
            file.write(struct.pack("<I", masked_crc32c(record)))
            written += 1
    return written
