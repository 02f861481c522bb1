"""The driver's view of the kernel's mount table, and its bind mounts, on real mounts."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi_driver.mounts import Health, bind_mount, detach, mount_at, probe


@pytest.fixture
def odd_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A source and a target whose names need mountinfo's octal escapes; unmounted after."""
    source = tmp_path / "data set\tv1\\x"
    target = tmp_path / "pod target"
    source.mkdir()
    target.mkdir()
    (source / "file").write_text("content")
    yield source, target
    for _ in range(4):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_read_only_bind_of_an_oddly_named_directory(odd_dirs):
    source, target = odd_dirs
    bind_mount(str(source), str(target), read_only=True)
    entry = mount_at(str(target))
    assert entry is not None
    assert entry.mount_point == str(target)
    assert entry.root.endswith("/data set\tv1\\x")
    assert entry.read_only and {"nosuid", "nodev"} <= set(entry.options)
    assert (target / "file").read_text() == "content"
    with pytest.raises(OSError) as refused:
        (target / "new").write_text("x")
    assert refused.value.errno == errno.EROFS
    assert probe(str(target)).health is Health.HEALTHY


def test_writable_bind_and_detach_of_stacked_mounts(odd_dirs):
    source, target = odd_dirs
    bind_mount(str(source), str(target), read_only=False)
    bind_mount(str(source), str(target), read_only=True)
    assert mount_at(str(target)).read_only, "the topmost mount is the one in effect"
    detach(str(target))
    assert mount_at(str(target)) is None
    assert probe(str(target)).health is Health.NOT_MOUNTED
    bind_mount(str(source), str(target), read_only=False)
    (target / "written").write_text("through the bind")
    assert (source / "written").read_text() == "through the bind"


def test_probe_of_a_missing_path(tmp_path):
    assert probe(str(tmp_path / "missing")).health is Health.ABSENT
