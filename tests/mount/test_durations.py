"""One duration parser for flags, YAML config values and CSI volume attributes: seconds as a
number, rclone's and Go's units, `inf` where an option takes it; a clear line otherwise."""

from __future__ import annotations

import math

import pytest
from support import run_avafs

from avafs.config.durations import parse_duration
from avafs.config.file import load_config
from avafs.config.options import parse_option
from avafs.errors import AvafsError
from csi_driver.errors import CsiError
from csi_driver.volume_spec import parse_volume_context


@pytest.mark.parametrize("text, seconds", [
    ("60", 60.0), ("0.5", 0.5), (30, 30.0), (1.5, 1.5), ("90s", 90.0), ("5m", 300.0),
    ("1h", 3600.0), ("1h30m", 5400.0), ("2d", 172800.0), ("500ms", 0.5), ("1.5m", 90.0),
    ("inf", math.inf), ("Infinity", math.inf), (" 5M ", 300.0),
])
def test_seconds_and_units(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "five", "5 m", "m", "", "1.5.3m", "nan", True])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="a duration such as 90s, 5m or 1h30m"):
        parse_duration(text)


def test_every_option_that_takes_seconds_takes_units(tmp_path):
    assert parse_option("metadata_ttl", "5m", "--metadata-ttl") == 300.0
    assert parse_option("metadata_ttl", "inf", "--metadata-ttl") == math.inf
    assert parse_option("writeback_delay", "90s", "--writeback-delay") == 90.0
    assert parse_option("store_timeout", "1m", "--store-timeout") == 60.0
    assert parse_option("cluster_timeout", "500ms", "--cluster-timeout") == 0.5
    assert parse_option("cluster_lease_ttl", "1m", "--cluster-lease-ttl") == 60
    config = tmp_path / "avafs.yaml"
    config.write_text("namespace:\n  d: file:///tmp\nmetadata_ttl: 1h\n")
    assert load_config(config)[1]["metadata_ttl"] == 3600.0
    spec, _ = parse_volume_context({"source": "s3://b", "metadataTtl": "5m"}, read_only=False)
    assert spec.mount_flags() == ["--metadata-ttl", "5m"]


@pytest.mark.parametrize("name, text, expected", [
    ("metadata_ttl", "5x", "a duration such as 90s, 5m or 1h30m, got '5x'"),
    ("metadata_ttl", "-3", "must be 0 or more seconds (or inf)"),
    ("store_timeout", "inf", "must be a number of seconds above 0"),
    ("cluster_lease_ttl", "1.5", "must be 2 or more whole seconds"),
    ("cluster_lease_ttl", "inf", "must be 2 or more whole seconds"),
])
def test_durations_out_of_range_are_named(name, text, expected):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(AvafsError, match=f"invalid {flag}: ") as error:
        parse_option(name, text, flag)
    assert expected in str(error.value)
    with pytest.raises(CsiError, match="volumeAttributes.metadataTtl"):
        parse_volume_context({"source": "s3://b", "metadataTtl": "5x"}, read_only=False)


def test_a_mount_and_a_flush_take_durations_with_units(local_bucket, mount):
    mnt = mount(local_bucket.as_uri(), "--metadata-ttl", "5m", "--writeback-delay", "90s")
    (mnt / "written.txt").write_text("kept")
    assert not (local_bucket / "written.txt").exists()
    result = run_avafs("flush", str(mnt), "--timeout", "1m")
    assert result.returncode == 0, result.stderr
    assert (local_bucket / "written.txt").read_text() == "kept"
