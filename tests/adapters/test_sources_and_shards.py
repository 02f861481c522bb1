"""Listing, manifests, shard readers and the splitting arithmetic, without a framework."""

from __future__ import annotations

import io
import tarfile

import pytest
from adapters_testlib import make_files, make_tar_shards, sample_payload, write_manifest
from hypothesis import assume, given
from hypothesis import strategies as st

from adapters.errors import EmptyDatasetError, ManifestError, ShardFormatError
from adapters.shards import SampleFormat, count_samples, read_samples, write_tfrecord
from adapters.sources import Item, ManifestSource, PrefixSource
from adapters.splitting import ReaderSlot, reader_span


def test_listing_is_lazy_and_cached(tmp_path):
    source = PrefixSource(tmp_path)  # nothing there yet: construction lists nothing
    keys = make_files(tmp_path, 6)
    assert [item.key for item in source.items()] == keys
    (tmp_path / "late.bin").write_bytes(b"x")
    assert len(source.items()) == 6  # one listing, reused


def test_empty_directory_is_a_clear_error(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(EmptyDatasetError, match=f"directory {tmp_path} .* has no samples"):
        PrefixSource(tmp_path).items()
    with pytest.raises(NotADirectoryError, match="no-such: not a directory"):
        PrefixSource(tmp_path / "no-such")


def test_manifest_paths_urls_and_labels(tmp_path):
    make_files(tmp_path / "root", 2)
    manifest = write_manifest(tmp_path / "train.jsonl", [
        {"path": "class0/img00000.bin", "label": 3},
        {"url": "s3://bucket/train/a.jpg", "label": 5, "split": "train"},
    ])
    items = ManifestSource(manifest, tmp_path / "root",
                           url_roots={"s3://bucket/train/": "/mnt/t"}).items()
    assert items == [
        Item(str(tmp_path / "root/class0/img00000.bin"), "class0/img00000.bin", {"label": 3}),
        Item("/mnt/t/a.jpg", "s3://bucket/train/a.jpg", {"label": 5, "split": "train"}),
    ]


@pytest.mark.parametrize(("line", "message"), [
    ('{"path": "a.bin", "label": 1', "train.jsonl:3: not valid JSON (Expecting ',' delimiter"),
    ('["a.bin"]', "train.jsonl:3: expected a JSON object, got list"),
    ('{"label": 1}', 'train.jsonl:3: needs exactly one of "path" or "url", found neither'),
    ('{"path": "/etc/passwd"}', 'train.jsonl:3: "path" must be relative to the mount root'),
    ('{"path": "../up.bin"}', 'train.jsonl:3: "path" must be relative to the mount root'),
    ('{"url": "s3://other/x.bin"}', "train.jsonl:3: no mount given for s3://other/x.bin"),
])
def test_bad_manifest_line_names_its_line(tmp_path, line, message):
    manifest = tmp_path / "train.jsonl"
    manifest.write_text('{"path": "a.bin"}\n\n' + line + "\n")
    with pytest.raises(ManifestError) as raised:
        ManifestSource(manifest, tmp_path).items()
    assert message in str(raised.value)


def test_tar_shard_groups_fields_by_key(tmp_path):
    keys = make_tar_shards(tmp_path, [4])
    shard = Item(str(tmp_path / "shard-0000.tar"), "shard-0000.tar")
    assert count_samples(SampleFormat.TAR, shard) == 4
    samples = list(read_samples(SampleFormat.TAR, shard, skip=1, limit=2))
    assert [sample["__key__"] for sample in samples] == keys[1:3]
    assert samples[0] == {"__key__": "s00001", "__shard__": "shard-0000.tar",
                          "bin": sample_payload(1), "cls": b"1"}


def test_tar_shard_with_duplicate_field_is_refused(tmp_path):
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as archive:
        for name in ("a.jpg", "a.jpg"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ShardFormatError, match="sample 'a' has two 'jpg' files"):
        count_samples(SampleFormat.TAR, Item(str(path), "bad.tar"))


def test_tfrecord_round_trip_skip_and_limit(tmp_path):
    records = [bytes([index]) * index for index in range(20)]
    assert write_tfrecord(tmp_path / "r.tfrecord", records) == 20
    shard = Item(str(tmp_path / "r.tfrecord"), "r.tfrecord", {"label": 1})
    assert count_samples(SampleFormat.TFRECORD, shard) == 20
    samples = list(read_samples(SampleFormat.TFRECORD, shard, skip=5, limit=3))
    assert [sample["data"] for sample in samples] == records[5:8]
    assert samples[0]["__key__"] == "r.tfrecord:5" and samples[0]["label"] == 1


def test_tfrecord_corruption_and_truncation_fail_loudly(tmp_path):
    write_tfrecord(tmp_path / "r.tfrecord", [b"a" * 100, b"b" * 100])
    data = bytearray((tmp_path / "r.tfrecord").read_bytes())
    data[12 + 50] ^= 0xFF  # a flipped bit in the first record's body
    (tmp_path / "flipped.tfrecord").write_bytes(bytes(data))
    flipped = Item(str(tmp_path / "flipped.tfrecord"), "flipped.tfrecord")
    with pytest.raises(ShardFormatError, match="record 0 at byte 0 fails its data CRC"):
        list(read_samples(SampleFormat.TFRECORD, flipped))
    (tmp_path / "short.tfrecord").write_bytes((tmp_path / "r.tfrecord").read_bytes()[:-10])
    short = Item(str(tmp_path / "short.tfrecord"), "short.tfrecord")
    with pytest.raises(ShardFormatError, match="record at byte 116 is truncated"):
        count_samples(SampleFormat.TFRECORD, short)


@given(total=st.integers(1, 500), world=st.integers(1, 8), workers=st.integers(1, 5),
       drop_last=st.booleans())
def test_splits_are_equal_per_rank_and_cover_the_epoch(total, world, workers, drop_last):
    assume(not drop_last or total >= world)
    per_rank = []
    positions = []
    for rank in range(world):
        spans = [reader_span(total, ReaderSlot(world, rank, workers, worker), drop_last=drop_last)
                 for worker in range(workers)]
        per_rank.append(sum(span.count for span in spans))
        for span in spans:
            positions.extend(range(span.start, span.start + span.count))
    assert len(set(per_rank)) == 1
    assert sorted(positions) == list(range(len(positions)))  # disjoint and contiguous
    samples = [position % total for position in positions]
    if drop_last:
        assert len(set(samples)) == len(samples) == total // world * world
    else:
        assert set(samples) == set(range(total)) and len(samples) < total + world


def test_drop_last_with_fewer_samples_than_ranks_is_a_clear_error():
    with pytest.raises(EmptyDatasetError, match="3 samples cannot give each of 4 ranks one sample"):
        reader_span(3, ReaderSlot(4, 0), drop_last=True)
