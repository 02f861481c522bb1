"""Every user error of `avafs mount`/`umount`: one line on stderr, a non-zero exit, no secrets."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    AVAFS,
    NOBODY,
    TEST_CREDENTIALS,
    S3Server,
    free_port,
    run_avafs,
    unmount,
)

from avafs.host.processes import wait_for_exit


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for secret in (TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], "wrong-secret"):
        assert secret not in result.stderr
    return lines[0]


@pytest.fixture
def mnt(tmp_path):
    path = tmp_path / "mnt"
    path.mkdir()
    return path


def test_version_and_help():
    assert run_avafs("--version").stdout.startswith("avafs ")
    assert run_avafs("-V").stdout == run_avafs("--version").stdout
    for command in ([], ["mount"], ["umount"]):
        result = run_avafs(*command, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout


def test_unknown_scheme(mnt, tmp_path):
    line = one_line_error(run_avafs("mount", "gs://bucket", str(mnt), "--cache-dir", str(tmp_path)))
    assert "unknown scheme" in line and "s3://" in line


def test_local_directory_not_found(mnt, tmp_path):
    line = one_line_error(run_avafs("mount", f"file://{tmp_path}/nope", str(mnt),
                                    "--cache-dir", str(tmp_path / "c")))
    assert "not found" in line and "nope" in line


def test_bucket_not_found(s3_server, s3_env, mnt, tmp_path):
    """A mistyped bucket leaves no cache dir behind (the default one is named after it), in
    the foreground too (where the log on stderr also has the error)."""
    line = one_line_error(run_avafs("mount", "s3://no-such-bucket", str(mnt), "--endpoint-url",
                                    s3_server.endpoint, "--cache-dir", str(tmp_path / "c")))
    assert "bucket 'no-such-bucket' not found" in line
    assert not (tmp_path / "c").exists()
    foreground = run_avafs("mount", "--foreground", "s3://no-such-bucket", str(mnt),
                           "--endpoint-url", s3_server.endpoint, "--cache-dir", str(tmp_path / "c"))
    assert foreground.returncode == 1
    assert foreground.stderr.splitlines()[-1] == line
    assert not (tmp_path / "c").exists()


def test_access_denied(tmp_path, mnt, monkeypatch):
    """A failed mount keeps a cache dir that was there before it, and its log."""
    (tmp_path / "c").mkdir()
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    server = S3Server(tmp_path / "auth.log")
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
        line = one_line_error(run_avafs("mount", "s3://private", str(mnt), "--endpoint-url",
                                        server.endpoint, "--cache-dir", str(tmp_path / "c")))
    finally:
        server.stop()
    assert "access denied" in line and "credentials" in line
    assert "wrong-secret" not in (tmp_path / "c" / "avafs.log").read_text()


def test_endpoint_unreachable(s3_env, mnt, tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(run_avafs("mount", "s3://bucket", str(mnt), "--endpoint-url", endpoint,
                                    "--cache-dir", str(tmp_path / "c")))
    assert "cannot reach S3 endpoint" in line and endpoint in line


def test_mountpoint_missing(local_bucket, tmp_path):
    line = one_line_error(run_avafs("mount", local_bucket.as_uri(), str(tmp_path / "absent"),
                                    "--cache-dir", str(tmp_path / "c")))
    assert "does not exist" in line and "mkdir -p" in line


def test_already_mounted(local_bucket, mount, tmp_path):
    mnt = mount(local_bucket.as_uri())
    line = one_line_error(run_avafs("mount", local_bucket.as_uri(), str(mnt),
                                    "--cache-dir", str(tmp_path / "other")))
    assert "already mounted" in line


def test_cache_dir_in_use(local_bucket, mount, tmp_path):
    mount(local_bucket.as_uri(), cache_dir=tmp_path / "shared")
    second = tmp_path / "second"
    second.mkdir()
    line = one_line_error(run_avafs("mount", local_bucket.as_uri(), str(second),
                                    "--cache-dir", str(tmp_path / "shared")))
    assert "in use by another avafs mount" in line


def test_dead_mount_is_reported_and_cleared(local_bucket, mount, tmp_path):
    mnt = mount(local_bucket.as_uri())
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    assert wait_for_exit(pid, 30)
    line = one_line_error(run_avafs("mount", local_bucket.as_uri(), str(mnt),
                                    "--cache-dir", str(tmp_path / "c2")))
    assert "dead mount" in line and "avafs umount" in line
    assert run_avafs("umount", str(mnt)).returncode == 0
    mount(local_bucket.as_uri(), mountpoint=mnt)
    assert os.listdir(mnt) == []


AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--")
"""A command prefix: run as user nobody, who may still read (not write) what root may, so the
interpreter and the code run from wherever root installed them (its home, say)."""


def _in_private_mount_namespace(setup: str, *args: str,
                                user: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run avafs (after `user`, a command prefix such as AS_NOBODY) where `setup` has hidden
    or replaced something, without touching the real system."""
    command = " ".join([setup, "&&", "exec", *(f"'{a}'" for a in [*user, *AVAFS, *args])])
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=120)


def test_dev_fuse_missing(local_bucket, mnt, tmp_path):
    result = _in_private_mount_namespace("mount --bind /dev/null /dev/fuse && rm -f /tmp/.x",
                                         "mount", local_bucket.as_uri(), str(mnt),
                                         "--cache-dir", str(tmp_path / "c"))
    if "/dev/fuse" not in result.stderr:
        result = _in_private_mount_namespace(
            "mount -t tmpfs none /dev", "mount", local_bucket.as_uri(), str(mnt),
            "--cache-dir", str(tmp_path / "c"))
    line = one_line_error(result)
    assert "/dev/fuse" in line


def _fuse_device_with_mode(folder: Path, mode: str) -> str:
    """Setup that puts a copy of /dev/fuse with `mode` in its place (a tmpfs of its own
    holds the copy: the test's folder may not allow device files)."""
    device = os.stat("/dev/fuse").st_rdev
    return (f"mkdir -p {folder} && mount -t tmpfs avafs-test {folder} && mknod -m {mode} "
            f"{folder}/fuse c {os.major(device)} {os.minor(device)} && "
            f"mount --bind {folder}/fuse /dev/fuse")


@pytest.fixture
def nobodys() -> Iterator[tuple[str, Path, Path]]:
    """A local bucket, a mountpoint and a cache dir of user nobody's: all that nobody's mount
    needs but /dev/fuse (pytest's own tmp dirs are root's alone)."""
    home = Path(tempfile.mkdtemp(prefix="avafs-nobody-"))
    for path in (home, home / "bucket", home / "mnt"):
        path.mkdir(exist_ok=True)
        os.chown(path, NOBODY, NOBODY)
    yield (home / "bucket").as_uri(), home / "mnt", home / "cache"
    shutil.rmtree(home)


def test_dev_fuse_this_user_may_not_open(nobodys, tmp_path):
    source, mountpoint, cache = nobodys
    line = one_line_error(_in_private_mount_namespace(
        _fuse_device_with_mode(tmp_path / "dev", "600"), "mount", source, str(mountpoint), "--cache-dir", str(cache), user=AS_NOBODY))
    assert "cannot open /dev/fuse: permission denied" in line and "chmod 0666" in line


def test_allow_other_for_a_user_without_user_allow_other(nobodys, tmp_path):
    source, mountpoint, cache = nobodys
    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    setup = (_fuse_device_with_mode(tmp_path / "dev", "666")
             + f" && mount --bind {conf} /etc/fuse.conf")
    line = one_line_error(_in_private_mount_namespace(
        setup, "mount", source, str(mountpoint), "--cache-dir", str(cache), "--allow-other",
        user=AS_NOBODY))
    assert "--allow-other needs a line 'user_allow_other' in /etc/fuse.conf" in line


@pytest.mark.parametrize("setup, cache_dir, expected", [
    ("touch {tmp}/file", "{tmp}/file", "cache dir {tmp}/file is a file, not a directory"),
    ("touch {tmp}/file", "{tmp}/file/cache",
     "cannot create cache dir {tmp}/file/cache: {tmp}/file is a file, not a directory"),
    ("mkdir {tmp}/ro && mount --bind {tmp}/ro {tmp}/ro && mount -o remount,bind,ro {tmp}/ro",
     "{tmp}/ro", "cache dir {tmp}/ro is not writable (its file system is mounted read-only)"),
    ("mkdir {tmp}/ro && mount --bind {tmp}/ro {tmp}/ro && mount -o remount,bind,ro {tmp}/ro",
     "{tmp}/ro/cache", "cannot create cache dir {tmp}/ro/cache: Read-only file system"),
])
@pytest.mark.parametrize("foreground", [[], ["--foreground"]])
def test_unusable_cache_dir(local_bucket, mnt, tmp_path, setup, cache_dir, expected, foreground):
    line = one_line_error(_in_private_mount_namespace(
        setup.format(tmp=tmp_path), "mount", *foreground, local_bucket.as_uri(), str(mnt),
        "--cache-dir", cache_dir.format(tmp=tmp_path)))
    assert expected.format(tmp=tmp_path) in line
    assert "give --cache-dir a" in line


def _hide_system_libfuse() -> str:
    """The shell commands that hide the system's libfuse3 in a private mount namespace."""
    libraries = glob.glob("/usr/lib/*/libfuse3.so.3*") + glob.glob("/lib/*/libfuse3.so.3*")
    assert libraries, "libfuse3 is installed on test machines"
    return " && ".join(f"mount --bind /dev/null {path}" for path in libraries)


def _pyfuse3_links_the_system_libfuse() -> bool:
    """Whether the installed pyfuse3 loads the shared libfuse3: built against the system's
    (stock pyfuse3, or where build_libfuse.sh could not run), not the static one
    scripts/build_libfuse.sh makes."""
    import pyfuse3  # noqa: F401

    return "libfuse3.so" in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not _pyfuse3_links_the_system_libfuse(),
                    reason="pyfuse3 carries its own libfuse (scripts/build_libfuse.sh)")
def test_libfuse_missing(local_bucket, mnt, tmp_path):
    line = one_line_error(_in_private_mount_namespace(
        _hide_system_libfuse(), "mount", local_bucket.as_uri(), str(mnt),
        "--cache-dir", str(tmp_path / "c")))
    assert "libfuse3" in line and "apt-get install" in line


@pytest.mark.skipif(_pyfuse3_links_the_system_libfuse(),
                    reason="pyfuse3 is built against the system's libfuse3")
def test_a_pyfuse3_carrying_its_own_libfuse_mounts_without_the_systems(local_bucket, mnt,
                                                                        tmp_path):
    (local_bucket / "file.txt").write_bytes(b"read without libfuse3.so")
    avafs = " ".join(f"'{part}'" for part in AVAFS)
    result = _in_private_mount_namespace(
        f"{_hide_system_libfuse()} && {avafs} mount {local_bucket.as_uri()} {mnt} "
        f"--cache-dir {tmp_path / 'c'} && cat {mnt / 'file.txt'}", "umount", str(mnt))
    assert (result.returncode, result.stdout) == (0, "read without libfuse3.so"), result.stderr


@pytest.mark.parametrize("flags, expected", [
    (["--ram-cache", "lots"], "invalid --ram-cache"),
    (["--disk-cache", "12XB"], "invalid --disk-cache"),
    (["--block-size", "0"], "invalid --block-size"),
    (["--high-watermark", "1.5"], "invalid --high-watermark"),
    (["--low-watermark", "0.95"], "invalid watermarks"),
    (["--metadata-ttl", "-3"], "invalid --metadata-ttl"),
    (["--metadata-ttl", "5x"], "invalid --metadata-ttl: must be a number of seconds or a "
                               "duration such as 90s, 5m or 1h30m, got '5x'"),
    (["--read-ahead", "lots"], "invalid --read-ahead: must be a whole number 0 or more"),
    (["--high-watermark", "high"], "invalid --high-watermark: must be a fraction in (0, 1]"),
    (["--writeback", "sometimes"], "invalid --writeback"),
    (["--endpoint-url", "127.0.0.1:9"], "did you mean http://127.0.0.1:9?"),
    (["--endpoint-url", "ftp://host"], "expected an http:// or https:// URL"),
    (["--disk-cache", "10m"], "k M G T (powers of 1000"),
    (["--disk-cahce", "10Gi"], "unrecognized argument --disk-cahce; did you mean --disk-cache?"),
    (["--cache-size=10G"], "unrecognized argument --cache-size=10G; did you mean --disk-cache?"),
    (["--dir-cache-time", "5"], "did you mean --metadata-ttl?"),
    (["--cluster-cache", "seaweed/cache"], "expected s3://BUCKET[/prefix]"),
    (["--cluster-endpoint-url", "http://seaweed:8333"], "need --cluster-cache"),
    (["--cluster-cache", "s3://cache", "--cluster-timeout", "0"], "invalid --cluster-timeout"),
])
def test_invalid_option_values(local_bucket, mnt, tmp_path, flags, expected):
    line = one_line_error(run_avafs("mount", local_bucket.as_uri(), str(mnt), *flags,
                                    "--cache-dir", str(tmp_path / "c")))
    assert expected in line


@pytest.mark.parametrize("text, expected", [
    ("namespace:\n  data: s3://b\n  bad: [unclosed\n", "line 4"),
    ("namespace:\n  data: file:///tmp\ndisk_cache: huge\n", "line 3"),
    ("namespace:\n  data: file:///tmp\ncolour: blue\n", "unknown config key 'colour'"),
    ("namespace:\n  data: file:///tmp\ndisk_cahce: 1Gi\n", "did you mean 'disk_cache'?"),
    ("disk_cache: 1GiB\n", "no 'namespace'"),
    ("namespace:\n  a/b: file:///tmp\n", "without '/'"),
])
def test_bad_config(mnt, tmp_path, text, expected):
    config = tmp_path / "avafs.yaml"
    config.write_text(text)
    line = one_line_error(run_avafs("mount", "--config", str(config), str(mnt),
                                    "--cache-dir", str(tmp_path / "c")))
    assert expected in line and str(config) in line


def warnings_of_a_mount(*args: str, mountpoint: Path) -> list[str]:
    """The stderr lines of an `avafs mount` that must succeed; unmounted again."""
    try:
        result = run_avafs("mount", *args, str(mountpoint))
        assert result.returncode == 0, result.stderr
    finally:
        unmount(mountpoint)
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("avafs: warning: ") for line in lines), result.stderr
    return lines


def test_an_unreachable_cluster_tier_is_a_warning_at_mount(local_bucket, mnt, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv("AVAFS_CLUSTER_ACCESS_KEY_ID", "cluster-key")
    monkeypatch.setenv("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "cluster-secret")
    endpoint = f"http://127.0.0.1:{free_port()}"
    [line] = warnings_of_a_mount(local_bucket.as_uri(), "--cluster-cache", "s3://cache/nodes",
                                 "--cluster-endpoint-url", endpoint, "--cache-dir",
                                 str(tmp_path / "c"), mountpoint=mnt)
    assert "the cluster tier s3://cache/nodes/ does not answer" in line and endpoint in line
    assert "reads go to the source until it does" in line and "cluster-secret" not in line


def test_cluster_tier_messages_name_its_own_endpoint_flag(local_bucket, mount, monkeypatch):
    monkeypatch.setenv("AVAFS_CLUSTER_ACCESS_KEY_ID", "cluster-key")
    monkeypatch.setenv("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "cluster-secret")
    (local_bucket / "a.bin").write_bytes(b"a" * 1000)
    mnt = mount(local_bucket.as_uri(), "--cluster-cache", "s3://cache/nodes",
                "--cluster-endpoint-url", f"http://127.0.0.1:{free_port()}")
    result = run_avafs("warmup", "--tier", "cluster", str(mnt))
    assert result.returncode == 1
    assert "--cluster-endpoint-url" in result.stderr and "--endpoint-url" not in \
        result.stderr.replace("--cluster-endpoint-url", "")


def test_recover_names_why_etcd_does_not_answer(monkeypatch):
    monkeypatch.setenv("AVAFS_CLUSTER_ACCESS_KEY_ID", "cluster-key")
    monkeypatch.setenv("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "cluster-secret")
    etcd = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(run_avafs("recover", "--node", "lost", "--cluster-cache",
                                    "s3://cache/nodes", "--etcd", etcd))
    assert line == (f"avafs: error: etcd does not answer ({etcd}: ConnectionFailedError): "
                    "check --etcd")


def test_a_disk_cache_larger_than_the_disk_is_a_warning(local_bucket, mnt, tmp_path):
    [line] = warnings_of_a_mount(local_bucket.as_uri(), "--disk-cache", "10Pi", "--cache-dir",
                                 str(tmp_path / "c"), mountpoint=mnt)
    assert f"--disk-cache 10240.0 TiB is more than the file system of {tmp_path / 'c'}" in line
    assert "give a smaller --disk-cache" in line
    assert warnings_of_a_mount(local_bucket.as_uri(), "--disk-cache", "16Mi", "--cache-dir",
                               str(tmp_path / "c"), mountpoint=mnt) == []


def test_a_one_letter_decimal_size_is_a_warning(local_bucket, mnt, tmp_path):
    """`10G` is 10^9 bytes as Kubernetes reads it, not rclone's 2^30: said, not refused."""
    [line] = warnings_of_a_mount(local_bucket.as_uri(), "--ram-cache", "1G", "--cache-dir",
                                 str(tmp_path / "c"), mountpoint=mnt)
    assert line == ("avafs: warning: --ram-cache 1G is 1*10^9 bytes (Kubernetes reads G as a "
                    "power of 1000, rclone as a power of 1024): write 1Gi for 1*2^30 bytes, or "
                    "1GB to keep powers of 1000 without this warning")
    config = tmp_path / "avafs.yaml"
    config.write_text(f"namespace:\n  data: {local_bucket.as_uri()}\nram_cache: 500M\n"
                      "disk_cache: 1GB\n")
    [line] = warnings_of_a_mount("--config", str(config), "--cache-dir", str(tmp_path / "c"),
                                 mountpoint=mnt)
    assert line.startswith(f"avafs: warning: {config}, line 3: ram_cache: 500M is 500*10^6 bytes")


def test_umount_of_something_not_mounted(mnt):
    line = one_line_error(run_avafs("umount", str(mnt)))
    assert "not mounted" in line


@pytest.mark.parametrize("args", [["flush", "/tmp", "--timeout", "-1"],
                                  ["status", "/tmp", "--watch", "inf"],
                                  ["status", "/tmp", "--watch", "soon"]])
def test_bad_seconds_are_one_line(args):
    line = one_line_error(run_avafs(*args))
    assert "must be a number of seconds above 0" in line


def test_help_states_the_size_units():
    help_text = " ".join(run_avafs("mount", "--help").stdout.split())
    assert "Ki Mi Gi Ti (powers of 1024" in help_text and "k M G T (powers of 1000" in help_text
    assert "10G is 10*10^9" in help_text


def test_missing_arguments_are_one_line(tmp_path):
    line = one_line_error(run_avafs("mount", "file:///tmp"))
    assert "SOURCE and MOUNTPOINT" in line


def test_unshare_is_available():
    assert shutil.which("unshare") and sys.platform == "linux"
