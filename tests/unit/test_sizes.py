"""One size parser for flags, YAML config values and CSI volume attributes."""

from __future__ import annotations

import pytest

from avafs.config.file import load_config
from avafs.config.options import parse_option
from avafs.config.sizes import parse_size
from avafs.errors import AvafsError
from csi_driver.errors import CsiError
from csi_driver.volume_spec import parse_volume_context


@pytest.mark.parametrize("text, size", [
    ("10Gi", 10 * 2**30), ("10GiB", 10 * 2**30), ("10gib", 10 * 2**30),
    ("10G", 10 * 10**9), ("10GB", 10 * 10**9), ("10g", 10 * 10**9),
    ("512Mi", 512 * 2**20), ("1.5Ti", int(1.5 * 2**40)), ("100k", 100_000), ("100K", 100_000),
    ("100Ki", 102_400), ("2M", 2_000_000), ("1T", 10**12), ("4096", 4096), ("7B", 7), (12, 12),
])
def test_kubernetes_quantities_and_byte_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["10m", "10X", "ten", "-1Gi", "1e9", ""])
def test_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="Ki Mi Gi Ti"):
        parse_size(text)


def test_flag_config_and_volume_attribute_agree(tmp_path):
    """`10G` and `10Gi` mean the same bytes whichever way they arrive."""
    config = tmp_path / "avafs.yaml"
    config.write_text("namespace:\n  d: file:///tmp\ndisk_cache: 10G\nram_cache: 2Gi\n")
    _, values = load_config(config)
    assert values["disk_cache"] == parse_option("disk_cache", "10G", "--disk-cache") == 10**10
    assert values["ram_cache"] == parse_option("ram_cache", "2Gi", "--ram-cache") == 2 * 2**30
    spec, _ = parse_volume_context({"source": "s3://b", "diskCache": "10G",
                                    "ramCache": "2Gi"}, read_only=False)
    assert spec.mount_flags() == ["--disk-cache", "10G", "--ram-cache", "2Gi"]
    with pytest.raises(CsiError, match="volumeAttributes.diskCache: invalid size '10m'"):
        parse_volume_context({"source": "s3://b", "diskCache": "10m"}, read_only=False)
    with pytest.raises(AvafsError, match="invalid --disk-cache: invalid size"):
        parse_option("disk_cache", "10X", "--disk-cache")
