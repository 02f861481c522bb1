"""File attributes through real mounts: mtimes, modes and owners kept in object metadata, read
back from objects other tools wrote, changed without re-sending data; and other users of an
--allow-other mount held to the modes."""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sample_data import payload
from support import NOBODY, as_nobody, run_avafs, unmount

from avafs.client import Client
from avafs.host.processes import wait_for_exit

MiB = 2**20
SET_NS = 1_600_000_000_123_456_000
"""A modification time with whole microseconds, which a float of Unix seconds keeps."""


def _head(server, bucket: str, key: str) -> dict:
    return server.client().head_object(Bucket=bucket, Key=key)


def _fresh_mount(s3_mount, mnt: Path, name: str) -> Path:
    """Another mount of the same bucket on an empty cache: what it shows comes from the store."""
    return s3_mount(mountpoint=mnt.parent / name, cache_dir=mnt.parent / f"{name}-cache")


def test_times_modes_and_owners_survive_upload_and_remount_on_an_empty_cache(
        s3_server, bucket, s3_mount):
    mnt = s3_mount("--metadata-ttl", "0")
    (mnt / "kept.bin").write_bytes(b"checkpoint")
    (mnt / "written-after.bin").write_bytes(b"x")
    os.utime(mnt / "kept.bin", ns=(SET_NS, SET_NS))
    os.chmod(mnt / "kept.bin", 0o640)
    os.chown(mnt / "kept.bin", 1234, 4321)
    os.utime(mnt / "written-after.bin", ns=(SET_NS, SET_NS))
    with open(mnt / "written-after.bin", "ab") as file:
        file.write(b"y")
    assert Client(mnt).flush()["bytes"] == 0

    metadata = _head(s3_server, bucket, "kept.bin")["Metadata"]
    changed = float(metadata.pop("ctime"))
    assert metadata == {"mtime": "1600000000.123456000", "atime": "1600000000.123456000",
                        "mode": str(stat.S_IFREG | 0o640), "uid": "1234", "gid": "4321"}
    assert abs(changed - time.time()) < 60  # the chown's time, not the mtime it was given
    for view in (mnt, _fresh_mount(s3_mount, mnt, "again")):
        kept = os.stat(view / "kept.bin")
        assert abs(kept.st_mtime_ns - SET_NS) < 1000
        assert (stat.S_IMODE(kept.st_mode), kept.st_uid, kept.st_gid) == (0o640, 1234, 4321)
        assert abs(kept.st_ctime - changed) < 1e-6 and abs(kept.st_atime_ns - SET_NS) < 1000
        assert (view / "kept.bin").read_bytes() == b"checkpoint"
        # A write after the utime is the newer modification: its time wins.
        assert os.stat(view / "written-after.bin").st_mtime_ns > SET_NS


def test_a_metadata_change_of_an_uploaded_file_sends_no_data(s3_server, bucket, s3_mount,
                                                             proxy):
    data = payload(7, 8 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="big.bin", Body=data)
    mnt = s3_mount(endpoint=proxy.endpoint)
    os.stat(mnt / "big.bin")
    before = proxy.sent_upstream
    os.utime(mnt / "big.bin", ns=(SET_NS, SET_NS))
    os.chmod(mnt / "big.bin", 0o600)
    assert Client(mnt).flush()["bytes"] == 0

    assert proxy.sent_upstream - before < 64 * 1024
    assert s3_server.client().get_object(Bucket=bucket, Key="big.bin")["Body"].read() == data
    metadata = _head(s3_server, bucket, "big.bin")["Metadata"]
    assert metadata["mtime"] == "1600000000.123456000"
    assert metadata["mode"] == str(stat.S_IFREG | 0o600)
    again = os.stat(_fresh_mount(s3_mount, mnt, "again") / "big.bin")
    assert (abs(again.st_mtime_ns - SET_NS) < 1000, stat.S_IMODE(again.st_mode)) == (True, 0o600)


def test_a_change_of_attributes_survives_a_crash_before_it_reaches_the_store(s3_server, bucket,
                                                                            s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="clean.txt", Body=b"in the store")
    mnt = s3_mount("--writeback-delay", "3600")
    os.chmod(mnt / "clean.txt", 0o600)
    (mnt / "dirty.txt").write_bytes(b"not uploaded")
    os.utime(mnt / "dirty.txt", ns=(SET_NS, SET_NS))
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    unmount(mnt)
    mnt = s3_mount(mountpoint=mnt)
    Client(mnt).flush()
    assert _head(s3_server, bucket, "clean.txt")["Metadata"]["mode"] == \
        str(stat.S_IFREG | 0o600)
    assert _head(s3_server, bucket, "dirty.txt")["Metadata"]["mtime"] == "1600000000.123456000"


def test_attributes_other_tools_wrote_are_read_back(s3_server, bucket, s3_mount):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="theirs.txt", Body=b"from s3fs", Metadata={
        "mtime": "1500000000.5", "mode": str(stat.S_IFREG | 0o751), "uid": "1001",
        "gid": "1002"})
    client.put_object(Bucket=bucket, Key="plain.txt", Body=b"no metadata")
    client.put_object(Bucket=bucket, Key="odd.txt", Body=b"bad values",
                      Metadata={"mtime": "yesterday", "mode": "rw-r--r--"})
    mnt = s3_mount("--file-mode", "0604", "--uid", "7", "--gid", "8")

    theirs = os.stat(mnt / "theirs.txt")
    assert theirs.st_mtime_ns == 1_500_000_000_500_000_000
    assert (stat.S_IMODE(theirs.st_mode), theirs.st_uid, theirs.st_gid) == (0o751, 1001, 1002)
    for name in ("plain.txt", "odd.txt"):
        defaults = os.stat(mnt / name)
        assert (stat.S_IMODE(defaults.st_mode), defaults.st_uid, defaults.st_gid) == (0o604, 7, 8)
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o755
    # What `ls -l` gets from one readdir, then a stat per entry, is the object's own.
    listed = {entry.name: entry.stat() for entry in os.scandir(mnt)}
    assert stat.S_IMODE(listed["theirs.txt"].st_mode) == 0o751


def test_listing_attrs_sends_no_head_and_shows_defaults(s3_server, bucket, s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="theirs.txt", Body=b"x",
                                  Metadata={"mode": str(stat.S_IFREG | 0o700)})
    mnt = s3_mount("--listing-attrs", "--file-mode", "0444")
    heads = len([line for line in s3_server.requests() if line.startswith("HEAD /")])
    assert stat.S_IMODE(os.stat(mnt / "theirs.txt").st_mode) == 0o444
    assert (mnt / "theirs.txt").read_bytes() == b"x"
    assert len([line for line in s3_server.requests() if line.startswith("HEAD /")]) == heads


def test_a_rewritten_file_keeps_its_mode_and_a_new_one_its_creation_mode(s3_server, bucket,
                                                                         s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="ro.txt", Body=b"old",
                                  Metadata={"mode": str(stat.S_IFREG | 0o600)})
    mnt = s3_mount()
    (mnt / "ro.txt").write_bytes(b"new")
    descriptor = os.open(mnt / "secret", os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(descriptor)
    Client(mnt).flush()
    assert _head(s3_server, bucket, "ro.txt")["Metadata"]["mode"] == str(stat.S_IFREG | 0o600)
    assert _head(s3_server, bucket, "secret")["Metadata"]["mode"] == str(stat.S_IFREG | 0o600)


def test_a_directorys_link_count_follows_subdirectories_made_and_removed_before_upload(
        s3_server, bucket, s3_mount):
    """The count merges the listing with what is still pending, without reading every
    pending file of the directory (tools such as find trust it)."""
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="top/old/a.bin", Body=b"a")
    client.put_object(Bucket=bucket, Key="top/gone/", Body=b"")
    mnt = s3_mount("--writeback-delay", "60")
    top = mnt / "top"
    assert sorted(os.listdir(top)) == ["gone", "old"]
    assert os.stat(top).st_nlink == 4
    (top / "new1").mkdir()
    (top / "new2").mkdir()
    for number in range(20):
        (top / f"{number}.txt").write_bytes(b"x")
    (top / "gone").rmdir()
    subdirectories = sum(entry.is_dir() for entry in os.scandir(top))

    assert subdirectories == 3
    assert os.stat(top).st_nlink == 2 + subdirectories


def test_directory_attributes_survive_upload_and_remount_on_an_empty_cache(
        s3_server, bucket, s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="listed/a.bin", Body=b"a")
    mnt = s3_mount("--dir-mode", "0775")
    os.mkdir(mnt / "made", 0o750)
    (mnt / "implicit").mkdir()
    os.chmod(mnt / "made", 0o711)
    os.chown(mnt / "made", 1234, 4321)
    os.utime(mnt / "made", ns=(SET_NS, SET_NS))
    os.chmod(mnt / "listed", 0o700)  # a directory with no marker gets one
    (mnt / "made" / "sub").mkdir()
    assert Client(mnt).flush()["bytes"] == 0

    marker = _head(s3_server, bucket, "made/")["Metadata"]
    assert (marker["mode"], marker["uid"], marker["gid"], marker["mtime"]) == \
        (str(stat.S_IFDIR | 0o711), "1234", "4321", "1600000000.123456000")
    fresh = _fresh_mount(s3_mount, mnt, "again")
    for view in (mnt, fresh):
        made = os.stat(view / "made")
        assert (stat.S_IMODE(made.st_mode), made.st_uid, made.st_gid) == (0o711, 1234, 4321)
        assert stat.S_IMODE(os.stat(view / "listed").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(view / "implicit").st_mode) == 0o755  # as it was made
    assert abs(os.stat(fresh / "made").st_mtime_ns - SET_NS) < 1000
    os.listdir(fresh / "made")
    assert os.stat(fresh / "made").st_nlink == 3  # its one subdirectory, now listed
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o775  # the root keeps --dir-mode
    with pytest.raises(PermissionError) as refused:
        os.chmod(mnt, 0o700)
    assert refused.value.errno == errno.EPERM


def test_times_advance_as_posix_says(s3_mount):
    """ctime moves with every change of data or attributes and with a rename; atime is kept
    when set and otherwise reads as the mtime; a directory's times move with its entries."""
    mnt = s3_mount()
    (mnt / "d").mkdir()
    (mnt / "d" / "f").write_bytes(b"x")
    os.utime(mnt / "d" / "f", ns=(SET_NS, SET_NS))
    before = os.stat(mnt / "d" / "f")
    assert before.st_atime_ns == before.st_mtime_ns == SET_NS
    assert before.st_ctime_ns > SET_NS
    current = mnt / "d" / "f"
    for name, change in (("f", lambda path: os.chmod(path, 0o600)),
                         ("f", lambda path: os.chown(path, 1234, -1)),
                         ("g", lambda path: os.rename(path, mnt / "d" / "g")),
                         ("f", lambda path: os.rename(path, mnt / "d" / "f"))):
        ctime = os.stat(current).st_ctime_ns
        time.sleep(0.01)
        change(current)
        current = mnt / "d" / name
        after = os.stat(current)
        assert after.st_ctime_ns > ctime and after.st_mtime_ns == SET_NS
    directory = os.stat(mnt / "d")
    time.sleep(0.01)
    (mnt / "d" / "new").write_bytes(b"y")
    assert os.stat(mnt / "d").st_mtime_ns > directory.st_mtime_ns
    assert Client(mnt).flush()["bytes"] == 0
    fresh = _fresh_mount(s3_mount, mnt, "again")
    assert os.stat(fresh / "d" / "f").st_ctime_ns == os.stat(mnt / "d" / "f").st_ctime_ns


def test_local_bucket_keeps_attributes_in_the_files_themselves(local_bucket, mount, tmp_path):
    (local_bucket / "f.bin").write_bytes(b"local data")
    inode = os.stat(local_bucket / "f.bin").st_ino
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "0")
    os.utime(mnt / "f.bin", ns=(SET_NS, SET_NS))
    os.chmod(mnt / "f.bin", 0o604)
    Client(mnt).flush()

    there = os.stat(local_bucket / "f.bin")
    assert (there.st_ino, there.st_mtime_ns, stat.S_IMODE(there.st_mode)) == \
        (inode, SET_NS, 0o604)
    again = mount(local_bucket.as_uri(), mountpoint=tmp_path / "again",
                  cache_dir=tmp_path / "again-cache")
    shown = os.stat(again / "f.bin")
    assert (shown.st_mtime_ns, stat.S_IMODE(shown.st_mode)) == (SET_NS, 0o604)
    assert (again / "f.bin").read_bytes() == b"local data"


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is the owner's alone).

    Torn down before the mount fixture that mounted inside it, so it unmounts what is
    mounted in it first: removing the tree through a live mount would delete the files
    from the bucket and then fail on the busy mountpoint, leaving the directory behind."""
    path = Path(tempfile.mkdtemp(prefix="avafs-public-"))
    path.chmod(0o755)
    yield path
    for child in path.iterdir():
        unmount(child)
    shutil.rmtree(path)


def _write_and_read(path: Path) -> Callable[[], str]:
    def action() -> str:
        path.write_bytes(b"written by nobody")
        return path.read_bytes().decode()
    return action


def _read(path: Path) -> Callable[[], str]:
    return lambda: path.read_bytes().decode()


def test_another_user_writes_where_uid_and_gid_make_it_owner_and_is_refused_elsewhere(
        s3_server, bucket, s3_mount, public_dir):
    s3_server.client().put_object(Bucket=bucket, Key="root-only.txt", Body=b"secret", Metadata={
        "uid": "0", "gid": "0", "mode": str(stat.S_IFREG | 0o600)})
    s3_server.client().put_object(Bucket=bucket, Key="shared.txt", Body=b"for all")
    mnt = s3_mount("--allow-other", "--uid", str(NOBODY), "--gid", str(NOBODY),
                   mountpoint=public_dir / "mnt")

    assert as_nobody(_write_and_read(mnt / "ckpt.txt")) == "written by nobody"
    assert as_nobody(_read(mnt / "shared.txt")) == "for all"
    assert as_nobody(_read(mnt / "root-only.txt")) == f"PermissionError {errno.EACCES}"
    Client(mnt).flush()
    assert s3_server.client().get_object(Bucket=bucket, Key="ckpt.txt")["Body"].read() == \
        b"written by nobody"
    # nobody chmods its own file; the mode stays across a remount on an empty cache.
    assert as_nobody(lambda: str(os.chmod(mnt / "ckpt.txt", 0o400))) == "None"
    Client(mnt).flush()
    again = _fresh_mount(s3_mount, mnt, "again")
    assert stat.S_IMODE(os.stat(again / "ckpt.txt").st_mode) == 0o400


def test_a_new_files_group_is_its_creators_or_a_set_group_id_parents(s3_server, bucket,
                                                                       s3_mount, public_dir):
    mnt = s3_mount("--allow-other", mountpoint=public_dir / "mnt")
    for name, mode, group in (("open", 0o777, None), ("sgid", 0o2777, 4321)):
        (mnt / name).mkdir()
        if group is not None:
            os.chown(mnt / name, -1, group)
        os.chmod(mnt / name, mode)
    assert as_nobody(lambda: str(os.mkdir(mnt / "open" / "mine"))) == "None"
    assert as_nobody(lambda: str(os.mkdir(mnt / "sgid" / "inherits"))) == "None"
    assert os.stat(mnt / "open" / "mine").st_gid == NOBODY  # its creator's
    inherits = os.stat(mnt / "sgid" / "inherits")
    assert inherits.st_gid == 4321 and inherits.st_mode & stat.S_ISGID
    Client(mnt).flush()
    again = _fresh_mount(s3_mount, mnt, "again")
    assert (os.stat(again / "open" / "mine").st_uid,
            os.stat(again / "open" / "mine").st_gid) == (NOBODY, NOBODY)
    assert os.stat(again / "sgid" / "inherits").st_gid == 4321


def test_without_uid_another_user_cannot_create_in_the_mounting_users_directories(
        s3_mount, public_dir):
    mnt = s3_mount("--allow-other", mountpoint=public_dir / "mnt")
    assert as_nobody(_write_and_read(mnt / "ckpt.txt")) == f"PermissionError {errno.EACCES}"


def test_uid_and_gid_by_name(s3_server, bucket, s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="shared.txt", Body=b"for all")
    mnt = s3_mount("--uid", pwd.getpwuid(NOBODY).pw_name, "--gid", grp.getgrgid(NOBODY).gr_name)
    info = os.stat(mnt / "shared.txt")
    assert (info.st_uid, info.st_gid) == (NOBODY, NOBODY)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--file-mode", "0999", "--file-mode"), ("--dir-mode", "rwx", "--dir-mode"),
    ("--uid", "-1", "--uid"), ("--uid", "bob-unknown", "invalid --uid: unknown user 'bob-unknown'"),
    ("--gid", "bob-unknown", "invalid --gid: unknown group 'bob-unknown'")])
def test_bad_attribute_flags_get_one_line_errors(local_bucket, tmp_path, flag, value, message):
    (tmp_path / "mnt").mkdir()
    result = run_avafs("mount", local_bucket.as_uri(), str(tmp_path / "mnt"), flag, value,
                       "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode != 0
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_change_of_attributes_reaches_a_version_replaced_meanwhile(s3_server, bucket,
                                                                    s3_mount):
    """The object was replaced in the store after the mount read it: a chmod still lands,
    on the version the store has, as a chmod applies to an inode whatever it holds."""
    s3_server.client().put_object(Bucket=bucket, Key="f.bin", Body=b"first")
    mnt = s3_mount("--metadata-ttl", "600")
    os.stat(mnt / "f.bin")
    s3_server.client().put_object(Bucket=bucket, Key="f.bin", Body=b"second version")
    os.chmod(mnt / "f.bin", 0o600)
    assert Client(mnt).flush()["bytes"] == 0
    stored = s3_server.client().get_object(Bucket=bucket, Key="f.bin")
    assert stored["Body"].read() == b"second version"
    assert stored["Metadata"]["mode"] == str(stat.S_IFREG | 0o600)
