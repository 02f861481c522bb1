"""Snapshots without a mount: the record's format, diff, the catalog's answers and errors on
a local directory and on a moto bucket with and without versions, and the snapshot store's
reads of recorded versions (avafs/snapshots/)."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import pytest

from avafs.config.options import build_mount_options, parse_option
from avafs.errors import AvafsError, SnapshotVersionGone
from avafs.metrics import Metrics
from avafs.snapshots.actions import perform
from avafs.snapshots.catalog import SnapshotCatalog
from avafs.snapshots.diff import diff
from avafs.snapshots.record import HEADER_READ, decode, decode_summary, encode, make
from avafs.snapshots.store import SnapshotStore
from avafs.snapshots.text import format_answer
from avafs.stores import open_store
from avafs.stores.base import SNAPSHOTS_PREFIX, ObjectInfo
from avafs.stores.instrumented import InstrumentedStore


def _files(*entries: tuple[str, int, str, str | None]) -> list[tuple[ObjectInfo, str | None]]:
    return [(ObjectInfo(key, size, etag, 1.5), version) for key, size, etag, version in entries]


def test_a_record_reads_back_whole_and_its_summary_from_its_first_bytes() -> None:
    many = [(f"train/{index:06d}.jpg", index, f"etag{index}", f"v{index}")
            for index in range(20_000)]
    snapshot = make("monday", "s3://data/set/", "train/", 1000.0, _files(*many))
    data = encode(snapshot)
    assert len(data) > HEADER_READ, "the test must show a summary read from a record's start"
    assert decode(data, "here") == snapshot
    summary = decode_summary(data[:HEADER_READ], "here")
    assert summary == snapshot.summary
    assert (summary.files, summary.bytes, summary.versioned) == (20_000, sum(range(20_000)), True)


def test_a_file_without_a_version_makes_the_snapshot_pinned_by_etags() -> None:
    snapshot = make("s", "file:///b", "", 1.0, _files(("a", 1, "e", "v1"), ("b", 1, "e", None)))
    assert not snapshot.summary.versioned
    assert not make("s", "file:///b", "", 1.0, []).summary.versioned


@pytest.mark.parametrize("damage", [
    lambda data: data[:10],
    lambda data: data[:-8],
    lambda data: b"not gzip at all",
    lambda data: gzip.compress(b'{"format": 99}') + data,
])
def test_a_damaged_record_is_one_line_naming_it(damage) -> None:
    data = encode(make("s", "file:///b", "", 1.0, _files(("a", 1, "e", None))))
    with pytest.raises(AvafsError, match=r"snapshot record here is damaged .*avafs snapshot "
                                         r"delete"):
        decode(damage(data), "here")


def test_diff_names_added_removed_and_changed_files_with_sizes() -> None:
    first = make("a", "u", "", 1.0, _files(("same", 1, "e1", None), ("gone", 2, "e2", None),
                                             ("changed", 3, "e3", None)))
    second = make("b", "u", "", 2.0, _files(("same", 1, "e1", None), ("new", 4, "e4", None),
                                              ("changed", 5, "e5", None)))
    difference = diff(first, second)
    assert difference.as_dict() == {"added": [["new", 4]], "removed": [["gone", 2]],
                                    "changed": [["changed", 3, 5]]}
    text = format_answer("diff", difference.as_dict())
    assert text.splitlines() == ["+ new (4 B)", "- gone (2 B)", "~ changed (3 B -> 5 B)",
                                 "1 added, 1 removed, 1 changed"]


def test_catalog_on_a_local_bucket(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.bin").write_bytes(b"a" * 10)
    (root / "train" / "b.bin").write_bytes(b"b" * 20)
    (root / "other.txt").write_text("x")
    catalog = SnapshotCatalog(open_store(root.as_uri()))
    made = catalog.create("v1", "train/")
    assert (made.files, made.bytes, made.prefix, made.versioned) == (2, 30, "train/", False)
    whole = catalog.create("all")
    assert whole.files == 3, "the reserved prefix itself is never recorded"
    assert (root / ".avafs-snapshots" / "v1").is_file()
    assert not list(root.glob(".avafs-snapshots/.avafs-upload-*")), "written by a rename"
    assert [summary.name for summary in catalog.summaries()] == ["v1", "all"]
    with pytest.raises(AvafsError, match=r"snapshot 'v1' exists already in file://.*pick "
                                         r"another name"):
        catalog.create("v1")
    with pytest.raises(AvafsError, match=r"no snapshot 'v2' in file://\S+: its snapshots are "
                                         r"v1, all$"):
        catalog.load("v2")
    with pytest.raises(AvafsError, match="invalid snapshot name"):
        catalog.create("../escape")
    assert perform(catalog, {"action": "delete", "name": "all"})["deleted"]["name"] == "all"
    listed = perform(catalog, {"action": "list"})
    assert [summary["name"] for summary in listed["snapshots"]] == ["v1"]
    assert format_answer("list", listed).splitlines()[1].split()[:4] == ["v1", "2", "30", "B"]
    catalog.delete("v1")
    with pytest.raises(AvafsError, match="it has none: make one with 'avafs snapshot create"):
        catalog.delete("v1")
    with pytest.raises(AvafsError, match="unknown snapshot action"):
        perform(catalog, {"action": "rename"})


def test_a_mount_never_shows_the_reserved_prefix(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    root.mkdir()
    (root / "a").write_text("a")
    store = InstrumentedStore(open_store(root.as_uri()), Metrics())
    SnapshotCatalog(store).create("v1")
    assert store.list_dir("").prefixes == []
    assert store.inner.list_dir("").prefixes == [SNAPSHOTS_PREFIX]


def test_snapshot_store_serves_the_recorded_tree_read_only(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "deep").write_bytes(b"deep")
    (root / "top").write_bytes(b"top")
    origin = open_store(root.as_uri())
    catalog = SnapshotCatalog(origin)
    catalog.create("v1")
    (root / "later").write_bytes(b"not recorded")
    store = SnapshotStore(origin, catalog.load("v1"))
    assert store.list_dir("").prefixes == ["d/"]
    assert [info.key for info in store.list_dir("").objects] == ["top"]
    assert store.list_dir("d/").prefixes == ["d/e/"]
    assert store.head("later") is None
    deep = store.head("d/e/deep")
    assert store.get_range("d/e/deep", 1, 3, deep.etag) == b"eep"
    with pytest.raises(AvafsError, match="read-only"):
        store.delete("top")


@pytest.fixture
def moto_bucket(s3_server, s3_env):
    def make_bucket(versioned: bool) -> str:
        name = f"snap-{uuid.uuid4().hex[:12]}"
        client = s3_server.client()
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name,
                                         VersioningConfiguration={"Status": "Enabled"})
        return name
    return make_bucket


def test_a_versioned_bucket_is_read_as_recorded_after_overwrites_and_deletes(s3_server,
                                                                             moto_bucket) -> None:
    bucket = moto_bucket(versioned=True)
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="set/a", Body=b"first a")
    client.put_object(Bucket=bucket, Key="set/a", Body=b"second a")
    client.put_object(Bucket=bucket, Key="set/b", Body=b"first b")
    client.put_object(Bucket=bucket, Key="set/gone", Body=b"deleted before")
    client.delete_object(Bucket=bucket, Key="set/gone")
    origin = open_store(f"s3://{bucket}/set", endpoint_url=s3_server.endpoint)
    summary = SnapshotCatalog(origin).create("v1")
    assert (summary.files, summary.versioned) == (2, True)
    client.put_object(Bucket=bucket, Key="set/a", Body=b"third a, longer")
    client.delete_object(Bucket=bucket, Key="set/b")
    store = SnapshotStore(origin, SnapshotCatalog(origin).load("v1"))
    for key, body in (("a", b"second a"), ("b", b"first b")):
        info = store.head(key)
        assert store.get_range(key, 0, info.size, info.etag) == body
        assert store.open_range(key, 1, 3, info.etag).read() == body[1:4]
    version = store.snapshot.files[0].version_id
    client.delete_object(Bucket=bucket, Key="set/a", VersionId=version)
    info = store.head("a")
    with pytest.raises(SnapshotVersionGone, match="a of snapshot 'v1'"):
        store.get_range("a", 0, info.size, info.etag)


def test_an_unversioned_bucket_is_pinned_by_etag_and_never_serves_new_bytes(s3_server,
                                                                            moto_bucket,
                                                                            caplog) -> None:
    bucket = moto_bucket(versioned=False)
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a", Body=b"old")
    origin = open_store(f"s3://{bucket}", endpoint_url=s3_server.endpoint)
    summary = SnapshotCatalog(origin).create("v1")
    assert (summary.files, summary.versioned) == (1, False)
    store = SnapshotStore(origin, SnapshotCatalog(origin).load("v1"))
    info = store.head("a")
    assert store.get_range("a", 0, 3, info.etag) == b"old"
    client.put_object(Bucket=bucket, Key="a", Body=b"new")
    for _ in range(3):
        with pytest.raises(SnapshotVersionGone):
            store.get_range("a", 0, 3, info.etag)
        with pytest.raises(SnapshotVersionGone):
            store.open_range("a", 0, 3, info.etag)
    lines = [record.getMessage() for record in caplog.records
             if "snapshot 'v1'" in record.getMessage()]
    assert len(lines) == 1 and "a of snapshot 'v1'" in lines[0] and "new" not in lines[0]


def test_a_snapshot_mount_is_read_only_never_revalidates_and_serves_one_source() -> None:
    options = build_mount_options({"": "s3://b"}, {"snapshot": "monday"})
    assert options.read_only and options.effective_metadata_ttl == float("inf")
    with pytest.raises(AvafsError, match="--snapshot serves one source"):
        build_mount_options({"a": "s3://a", "b": "s3://b"}, {"snapshot": "monday"})
    with pytest.raises(AvafsError, match="--snapshot mounts are read-only: drop --writeback"):
        build_mount_options({"": "s3://b"}, {"snapshot": "monday", "writeback": "cluster",
                                             "cluster_cache": "s3://c", "etcd": ("http://e:1",)})
    with pytest.raises(AvafsError, match="invalid --snapshot: must be a snapshot name"):
        parse_option("snapshot", "../x", "--snapshot")
