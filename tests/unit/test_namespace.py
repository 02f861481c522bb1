"""The namespace without FUSE or root: lookups from cached listings, pending writes in listings,
renames and directory changes checked and planned as POSIX has them, over a local bucket; and a
property test of random writes, renames and unlinks against a dict, then against the bucket."""

from __future__ import annotations

import errno
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_writeback import LocalWriteSide, store_files

from avafs.namespace import LIST_AHEAD, Namespace, Refused
from avafs.stores.base import Listing
from avafs.stores.local import LocalStore
from avafs.stores.metadata import Attrs
from avafs.writeback.pending import COPY, DATA, DELETED


def test_lookups_come_from_the_cached_listing_negative_ones_too(side):
    (side.bucket / "train").mkdir()
    (side.bucket / "train" / "a.jpg").write_bytes(b"a")
    train = side.directory_node("train")
    assert side.namespace.cached_entry(train, "a.jpg") is False  # never listed: ask the store
    assert side.namespace.entry(train, "a.jpg").info.size == 1
    (side.bucket / "train" / "b.jpg").write_bytes(b"b")  # behind the cached listing's back
    assert side.namespace.cached_entry(train, "a.jpg").info.size == 1
    assert side.namespace.cached_entry(train, "b.jpg") is None  # known absent, no I/O
    assert side.namespace.lookup(train, "b.jpg") is None
    side.namespace.refresh("train")
    assert side.namespace.lookup(train, "b.jpg").info.size == 1


def test_a_name_the_kernel_forgot_gets_its_inode_back_and_a_deleted_one_gives_it_to_no_one(side):
    """The kernel's cached copy of a directory read to its end names each entry with the inode
    it had; after the kernel forgets an entry, looking the name up again must give that same
    number, or the cached listing and stat() disagree. A name deleted meanwhile does not hand
    its number to whatever takes the name next, nor does a file to a directory."""
    (side.bucket / "d").mkdir()
    for name in ("a.bin", "b.bin"):
        (side.bucket / "d" / name).write_bytes(b"x")
    d = side.directory_node("d")
    first = {name: side.namespace.lookup(d, name).inode for name in ("a.bin", "b.bin")}

    assert side.namespace.forget(first["a.bin"], 1)
    assert side.namespace.lookup(d, "a.bin").inode == first["a.bin"]

    detached = side.namespace.lookup(d, "b.bin")
    assert detached.inode == first["b.bin"]
    side.namespace.detach(detached)
    assert side.namespace.forget(first["b.bin"], 2)
    assert side.namespace.lookup(d, "b.bin").inode not in first.values()

    side.namespace.forget(first["a.bin"], 1)
    (side.bucket / "d" / "a.bin").unlink()
    (side.bucket / "d" / "a.bin").mkdir()
    (side.bucket / "d" / "a.bin" / "inside").write_bytes(b"x")
    side.namespace.refresh("d")
    assert side.namespace.lookup(d, "a.bin").inode not in first.values()


def test_a_pending_write_is_listed_before_its_upload(side):
    (side.bucket / "old.bin").write_bytes(b"old")
    assert side.names() == ["old.bin"]  # listed and cached before the write
    side.write("new.bin", b"new data")
    entry = side.namespace.cached_entry(side.root, "new.bin")
    assert entry.info.size == 8
    assert side.names() == ["new.bin", "old.bin"]
    assert store_files(side.bucket) == {"old.bin": b"old"}
    side.flush()
    assert side.names() == ["new.bin", "old.bin"]
    assert side.namespace.listed_info("", "new.bin").size == 8  # the upload settled there


def test_a_pending_unlink_hides_a_stored_file(side):
    (side.bucket / "gone.bin").write_bytes(b"x")
    assert side.names() == ["gone.bin"]
    side.unlink("gone.bin")
    assert side.names() == []
    assert side.namespace.cached_entry(side.root, "gone.bin") is None
    side.flush()
    assert store_files(side.bucket) == {}


def test_renaming_a_directory_moves_its_pending_and_stored_children(side):
    (side.bucket / "run" / "logs").mkdir(parents=True)
    (side.bucket / "run" / "config.yaml").write_bytes(b"config")
    side.write("run/logs/step1.txt", b"pending log")
    run = side.directory_node("run")
    side.rename("run", "run-2")
    assert side.names() == ["run-2"]
    assert side.names("run-2") == ["config.yaml", "logs"]
    assert side.read("run-2/logs/step1.txt") == b"pending log"
    assert side.writeback.get("", "run-2/logs/step1.txt").kind == DATA
    assert side.writeback.get("", "run-2/config.yaml").kind == COPY
    assert side.writeback.get("", "run/config.yaml").kind == DELETED
    assert run.key == "run-2/"  # the kernel keeps the inode: it answers for the new prefix
    side.flush()
    assert store_files(side.bucket) == {"run-2/config.yaml": b"config",
                                        "run-2/logs/step1.txt": b"pending log"}
    assert not (side.bucket / "run").exists()


def test_renaming_a_file_over_another_replaces_it(side):
    side.write("a.txt", b"a")
    side.write("b.txt", b"b")
    replaced = side.namespace.lookup(side.root, "b.txt")
    plan = side.namespace.plan_rename(side.root, "a.txt", side.root, "b.txt", replace=True)
    assert plan.replaced is replaced and plan.takes_key_of(plan.renamed)
    side.namespace.rename(plan)
    assert side.namespace.node_of(side.root, "b.txt") is plan.renamed
    assert side.names() == ["b.txt"] and side.read("b.txt") == b"a"


@pytest.mark.parametrize(("old", "new", "replace", "refusal"), [
    ("missing", "x", True, errno.ENOENT),
    ("a.txt", "b.txt", False, errno.EEXIST),
    ("a.txt", "full", True, errno.EISDIR),
    ("full", "a.txt", True, errno.ENOTDIR),
    ("full", "full/inside", True, errno.EINVAL),
    ("empty", "full", True, errno.ENOTEMPTY),
])
def test_renames_posix_refuses_are_refused_with_its_errno(side, old, new, replace, refusal):
    (side.bucket / "full").mkdir()
    (side.bucket / "full" / "f").write_bytes(b"f")
    (side.bucket / "empty").mkdir()
    side.write("a.txt", b"a")
    side.write("b.txt", b"b")
    with pytest.raises(Refused) as raised:
        side.rename(old, new, replace)
    assert raised.value.errno == refusal
    assert side.writeback.status()["upload_queue"] == 2  # nothing changed


def test_mkdir_and_rmdir(side):
    (side.bucket / "full").mkdir()
    (side.bucket / "full" / "f").write_bytes(b"f")
    made = side.namespace.mkdir(side.root, "new", Attrs())
    assert made.is_dir and made.key == "new/"
    assert side.names() == ["full", "new"]
    with pytest.raises(Refused) as exists:
        side.namespace.mkdir(side.root, "new", Attrs())
    assert exists.value.errno == errno.EEXIST
    with pytest.raises(Refused) as not_empty:
        side.namespace.rmdir(side.root, "full")
    assert not_empty.value.errno == errno.ENOTEMPTY
    with pytest.raises(Refused) as not_a_directory:
        side.namespace.rmdir(side.directory_node("full"), "f")
    assert not_a_directory.value.errno == errno.ENOTDIR
    side.namespace.rmdir(side.root, "new")
    assert side.names() == ["full"]
    side.flush()
    assert not (side.bucket / "new").exists()


class ListingsHeldBack(LocalStore):
    """A local bucket whose listings, while `answer` is clear, are taken when asked and
    answered only once it is set: a LIST the store answered before an upload landed that
    arrives after it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked = threading.Event()
        self.answer = threading.Event()
        self.answer.set()

    def list_dir(self, prefix: str) -> Listing:
        listing = super().list_dir(prefix)
        self.asked.set()
        assert self.answer.wait(30)
        return listing


def test_a_listing_asked_before_uploads_land_and_answered_after_shows_them(tmp_path):
    """After a crash, the listing of a renamed directory is asked before the replayed copies
    of its files land, and answered after: it must show them (the file went missing from the
    mount until --metadata-ttl), and a file looked up while its copy was pending must name the
    version the store has now, not the pending state's (ESTALE on open)."""
    (tmp_path / "bucket" / "d1").mkdir(parents=True)
    store = ListingsHeldBack(tmp_path / "bucket")
    side = LocalWriteSide(tmp_path, store=store)
    try:
        side.write("d1/f", b"stored")
        side.flush()
        side.rename("d1", "d2")
        side.restart()
        looked_up = side.namespace.lookup(side.directory_node("d2"), "f")
        store.asked.clear()
        store.answer.clear()
        threading.Thread(target=side.namespace.listing, args=("", "d2/"), daemon=True).start()
        assert store.asked.wait(10)
        side.flush()
        stored = store.head("d2/f")
        assert side.namespace.current_info(looked_up) == stored
        store.answer.set()
        deadline = time.monotonic() + 10
        while side.namespace.cached_listing("", "d2/") is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert side.names("d2") == ["f"]
        assert side.namespace.listed_info("", "d2/f").etag == stored.etag
        assert side.read("d2/f") == b"stored"
    finally:
        side.close()


class ListingsCounted(LocalStore):
    """A local bucket that counts the listings asked of it, by prefix."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed: list[str] = []
        self._lock = threading.Lock()

    def list_dir(self, prefix: str) -> Listing:
        with self._lock:
            self.listed.append(prefix)
        return super().list_dir(prefix)

    def wait_for(self, prefixes: set[str]) -> None:
        deadline = time.monotonic() + 10
        while not prefixes <= set(self.listed):
            assert time.monotonic() < deadline, f"never listed: {prefixes - set(self.listed)}"
            time.sleep(0.01)


def test_a_walk_finds_the_next_subdirectories_listed_ahead_of_it(tmp_path):
    classes = [f"c{index:02d}" for index in range(3 * LIST_AHEAD)]
    for name in classes:
        (tmp_path / "tree" / name).mkdir(parents=True)
        (tmp_path / "tree" / name / "sample.jpg").write_bytes(name.encode())
        (tmp_path / "tree" / f"{name}.txt").write_bytes(b"a file between subdirectories")
    store = ListingsCounted(tmp_path)
    namespace = Namespace({"": store}, ttl=60.0)
    namespace.listing("", "tree/")
    namespace.listing("", "tree/c00/")
    window = {f"tree/{name}/" for name in classes[1:1 + LIST_AHEAD]}
    store.wait_for(window)
    time.sleep(0.1)
    assert set(store.listed) == {"tree/", "tree/c00/"} | window, "no further than the window"

    namespace.listing("", "tree/c01/")  # listed ahead: asking for it moves the window on
    store.wait_for({f"tree/{classes[1 + LIST_AHEAD]}/"})
    time.sleep(0.1)
    assert f"tree/{classes[2 + LIST_AHEAD]}/" not in store.listed, "one window, not two"
    for name in classes[2:]:  # the rest of the walk, each directory listed once
        listing = namespace.listing("", f"tree/{name}/")
        assert [entry.name for entry in listing.ordered] == ["sample.jpg"]
    assert sorted(store.listed) == ["tree/", *(f"tree/{name}/" for name in classes)]

    store.listed.clear()
    namespace.listing("", "tree/c00/")
    namespace.listing("", "tree/c01/")
    time.sleep(0.1)
    assert store.listed == [], "fresh listings are not fetched ahead again"


# --- random changes against a model ------------------------------------------------------------

DIRECTORIES = ("", "d", "e")
NAMES = ("a", "b", "c")
paths = st.tuples(st.sampled_from(DIRECTORIES), st.sampled_from(NAMES))
operations = st.one_of(
    st.tuples(st.just("write"), paths, st.binary(max_size=3000)),
    st.tuples(st.just("rename"), paths, paths),
    st.tuples(st.just("unlink"), paths),
    st.tuples(st.just("rename_directory")),
)


def _path(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def _apply(side: LocalWriteSide, files: dict[str, bytes], directories: set[str],
           operation: tuple) -> None:
    """Make the change on both sides, where POSIX allows it (the model decides)."""
    kind = operation[0]
    if kind == "write":
        (directory, name), data = operation[1], operation[2]
        if directory in directories:
            side.write(_path(directory, name), data)
            files[_path(directory, name)] = data
    elif kind == "rename":
        old, new = _path(*operation[1]), _path(*operation[2])
        if old in files and old != new and operation[2][0] in directories:
            side.rename(old, new)
            files[new] = files.pop(old)
    elif kind == "unlink":
        path = _path(*operation[1])
        if path in files:
            side.unlink(path)
            del files[path]
    else:
        old, new = ("d", "e") if "d" in directories else ("e", "d")
        side.rename(old, new)
        directories.symmetric_difference_update({old, new})
        for path in [path for path in files if path.startswith(f"{old}/")]:
            files[new + path[len(old):]] = files.pop(path)


def _check_listings(side: LocalWriteSide, files: dict[str, bytes],
                    directories: set[str]) -> None:
    for directory in directories:
        expected = {path.rpartition("/")[2] for path in files
                    if path.rpartition("/")[0] == directory}
        if directory == "":
            expected |= directories - {""}
        assert set(side.names(directory)) == expected, directory
    for path, data in files.items():
        assert side.read(path) == data, path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operations, max_size=12))
def test_random_changes_show_and_upload_as_a_dict_of_files_says(changes):
    with tempfile.TemporaryDirectory() as directory:
        side = LocalWriteSide(Path(directory))
        try:
            (side.bucket / "d").mkdir()
            files: dict[str, bytes] = {}
            directories = {"", "d"}
            for operation in changes:
                _apply(side, files, directories, operation)
                _check_listings(side, files, directories)
            status = side.flush()
            assert status["upload_queue"] == 0 and status["set_aside"] == []
            assert store_files(side.bucket) == files
            _check_listings(side, files, directories)
        finally:
            side.close()
