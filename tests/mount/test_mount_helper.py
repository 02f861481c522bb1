"""`mount -t fuse.avafs` with `-o` options, through the mount.fuse.avafs mount(8) finds in /sbin
(inside `run_example`'s namespace): each option kind reaches the mount, and an unknown one is
one line before anything is mounted."""

from __future__ import annotations

from support import run_example

SETUP = "mkdir -p /srv/bucket /mnt/data\necho hello > /srv/bucket/hello.txt"


def test_options_reach_the_mount(tmp_path):
    options = ("defaults,rw,ro,allow_other,uid=nobody,gid=65534,cache_dir=/var/cache/data,"
               "log_file=/var/lib/data.log,dir_mode=0750,_netdev,nofail,noauto,users,"
               "x-systemd.automount,x-systemd.mount-timeout=30")
    body = "\n".join([
        f"mount -t fuse.avafs file:///srv/bucket /mnt/data -o {options}",
        "stat -c '%U %g %a' /mnt/data",
        "cat /mnt/data/hello.txt",
        "touch /mnt/data/new 2>/dev/null || echo read-only",
        "awk '$5 == \"/mnt/data\" {print $6, $NF}' /proc/self/mountinfo",
        "grep -c 'mounted file:///srv/bucket at /mnt/data' /var/lib/data.log",
        "test -d /var/cache/data/disk && echo cache-dir",
        "avafs umount /mnt/data",
    ])
    result = run_example(tmp_path, body, setup=SETUP)
    assert result.returncode == 0, result.stderr
    owner, group, mode, text, refused, flags, super_options, logged, cache_dir = \
        result.stdout.split()
    assert (owner, group, mode, text, refused) == ("nobody", "65534", "750", "hello",
                                                   "read-only")
    assert {"ro", "noexec", "nosuid", "nodev"} <= set(flags.split(","))
    assert "allow_other" in super_options.split(",")
    assert (logged, cache_dir) == ("1", "cache-dir")


def test_an_unknown_option_is_one_line_and_mounts_nothing(tmp_path):
    body = "\n".join([
        "mount -t fuse.avafs file:///srv/bucket /mnt/data -o ro,cache_dri=/var/cache/x "
        "2> error || echo refused",
        "cat error",
        "mountpoint -q /mnt/data || echo not-mounted",
        "mount -t fuse.avafs file:///srv/bucket /mnt/data -o read_only=yes 2>&1 || true",
    ])
    result = run_example(tmp_path, body, setup=SETUP)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "refused",
        "mount.fuse.avafs: error: unknown mount option 'cache_dri': did you mean cache_dir?",
        "not-mounted",
        "mount.fuse.avafs: error: mount option read_only takes no value: write read_only, not "
        "read_only=yes",
    ]
