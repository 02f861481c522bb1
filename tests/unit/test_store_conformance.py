"""One conformance suite for the ObjectStore interface (avafs/stores/base.py): every backend a
mount can use answers the same calls the same way, so the tiers, the namespace and write-back
never need to know which one they talk to.

Run against the local directory store, the S3 store on a moto server, and the instrumented
wrapper every mount puts around its store (over the local store)."""

from __future__ import annotations

import contextlib
import io
import stat
import uuid
from collections.abc import Iterator

import pytest

from avafs.errors import ObjectChangedError
from avafs.metrics import Metrics
from avafs.stores import open_store
from avafs.stores.base import ObjectStore
from avafs.stores.instrumented import InstrumentedStore
from avafs.stores.metadata import Attrs

MTIME = 1_600_000_000.25


@pytest.fixture(params=["local", "s3", "instrumented"])
def store(request, tmp_path) -> Iterator[ObjectStore]:
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        request.getfixturevalue("s3_env")
        bucket = f"conformance-{uuid.uuid4().hex[:12]}"
        server.client().create_bucket(Bucket=bucket)
        yield open_store(f"s3://{bucket}/under/a/prefix", endpoint_url=server.endpoint)
        return
    (tmp_path / "bucket").mkdir()
    local = open_store((tmp_path / "bucket").as_uri())
    yield InstrumentedStore(local, Metrics()) if request.param == "instrumented" else local


def _put(store: ObjectStore, key: str, data: bytes, mtime: float | None = None,
         attrs: Attrs | None = None):
    return store.put(key, io.BytesIO(data), len(data), mtime, attrs)


def test_check_passes_on_a_usable_store(store):
    store.check()


def test_put_then_head_and_ranges_read_back_the_bytes(store):
    info = _put(store, "d/a.bin", b"0123456789")
    assert (info.key, info.size) == ("d/a.bin", 10)
    assert store.head("d/a.bin").etag == info.etag
    assert store.get_range("d/a.bin", 2, 5, info.etag) == b"23456"
    with contextlib.closing(store.open_range("d/a.bin", 4, 6, info.etag)) as stream:
        assert stream.read() == b"456789"
    assert store.head("d/missing.bin") is None


def test_a_listing_is_one_level_with_subdirectories_as_prefixes(store):
    for key in ("top.bin", "d/a.bin", "d/b.bin", "d/sub/c.bin"):
        _put(store, key, b"x")
    root = store.list_dir("")
    assert root.prefixes == ["d/"] and [info.key for info in root.objects] == ["top.bin"]
    inside = store.list_dir("d/")
    assert inside.prefixes == ["d/sub/"]
    assert [info.key for info in inside.objects if info.key != "d/"] == ["d/a.bin", "d/b.bin"]
    assert store.list_dir("nothing/").objects == []


def test_a_rewritten_object_is_a_new_version_and_old_reads_are_refused(store):
    first = _put(store, "v.bin", b"first")
    second = _put(store, "v.bin", b"second!")
    assert first.etag != second.etag
    with pytest.raises(ObjectChangedError):
        store.get_range("v.bin", 0, 5, first.etag)


def test_attributes_and_file_types_survive_put_and_head(store):
    _put(store, "kept.bin", b"data", MTIME, Attrs(mode=0o640, atime=MTIME - 5))
    info = store.head("kept.bin")
    assert info.mtime == pytest.approx(MTIME) and info.attrs.mode == 0o640
    assert info.attrs.atime == pytest.approx(MTIME - 5)
    _put(store, "link", b"kept.bin", MTIME, Attrs(file_type=stat.S_IFLNK))
    link = store.head("link")
    assert link.attrs.file_type == stat.S_IFLNK and link.size == len(b"kept.bin")
    assert store.get_range("link", 0, link.size, link.etag) == b"kept.bin"
    _put(store, "pipe", b"", MTIME, Attrs(mode=0o600, file_type=stat.S_IFIFO))
    assert store.head("pipe").attrs.file_type == stat.S_IFIFO


def test_a_directory_marker_keeps_the_directorys_attributes(store):
    _put(store, "dir/", b"", MTIME, Attrs(mode=0o711, file_type=stat.S_IFDIR))
    marker = store.head("dir/")
    assert marker.attrs.mode == 0o711 and marker.attrs.file_type == stat.S_IFDIR
    listed = store.list_dir("dir/")
    assert [info.key for info in listed.objects] == ["dir/"]  # the marker itself, no file


def test_a_copy_onto_itself_changes_attributes_and_keeps_the_bytes(store):
    info = _put(store, "c.bin", b"payload", MTIME, Attrs(mode=0o644))
    changed = store.copy("c.bin", "c.bin", info.etag, MTIME + 1, Attrs(mode=0o600))
    assert changed.attrs.mode == 0o600 and changed.mtime == pytest.approx(MTIME + 1)
    assert store.get_range("c.bin", 0, 7, changed.etag) == b"payload"
    moved = store.copy("c.bin", "moved.bin", changed.etag)
    assert store.get_range("moved.bin", 0, 7, moved.etag) == b"payload"
    _put(store, "c.bin", b"rewritten")
    with pytest.raises(ObjectChangedError):
        store.copy("c.bin", "other.bin", changed.etag)  # a version that is gone


def test_delete_is_idempotent(store):
    _put(store, "gone.bin", b"x")
    store.delete("gone.bin")
    store.delete("gone.bin")
    assert store.head("gone.bin") is None


def test_keys_the_store_cannot_hold_are_told_apart(store):
    assert store.key_fits("a/" * 100 + "f.bin")
    assert not store.key_fits("/".join(["k" * 250] * 17))  # past S3's keys and PATH_MAX
