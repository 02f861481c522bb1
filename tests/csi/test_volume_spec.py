"""From a PersistentVolume's volumeAttributes to the `avafs mount` command line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from csi_driver.errors import CsiError
from csi_driver.volume_spec import (
    SWITCH_ATTRIBUTES,
    VALUE_ATTRIBUTES,
    flag_name,
    parse_credentials,
    parse_volume_context,
    resolve_sub_path,
    with_mount_group,
)


def test_attributes_become_flags_of_the_same_name():
    spec, sub_path = parse_volume_context({
        "source": "s3://datasets/imagenet", "diskCache": "100GiB", "ramCache": "8GiB",
        "metadataTtl": "inf", "immutable": "true", "readOnly": "false", "writeback": "SYNC",
        "endpointUrl": "http://minio.storage:9000", "readAhead": "8", "subPath": "train/./x",
        "csi.storage.k8s.io/pod.name": "trainer-0"}, read_only=False)
    assert spec.source == "s3://datasets/imagenet" and sub_path == "train/x"
    assert spec.mount_flags() == [
        "--disk-cache", "100GiB", "--endpoint-url", "http://minio.storage:9000", "--immutable",
        "--metadata-ttl", "inf", "--ram-cache", "8GiB", "--read-ahead", "8",
        "--writeback", "sync"]


def test_read_only_comes_from_the_access_mode_or_the_attribute():
    from_mode, _ = parse_volume_context({"source": "s3://b"}, read_only=True)
    from_attribute, _ = parse_volume_context({"source": "s3://b", "readOnly": "TRUE"},
                                             read_only=False)
    assert from_mode.mount_flags() == from_attribute.mount_flags() == ["--read-only"]
    assert from_mode == from_attribute


def test_every_flag_the_driver_can_pass_is_one_avafs_mount_accepts():
    """The attribute table is the driver's; `avafs mount --help` is avafs's public contract."""
    help_text = subprocess.run([sys.executable, "-m", "avafs", "mount", "--help"],
                               capture_output=True, text=True, timeout=60, check=True).stdout
    offered = set(re.findall(r"--[a-z][a-z-]+", help_text))
    driver_flags = {flag_name(name) for name in [*VALUE_ATTRIBUTES, *SWITCH_ATTRIBUTES]}
    assert driver_flags | {"--cache-dir", "--allow-other", "--config"} <= offered, (
        driver_flags - offered)


@pytest.mark.parametrize("template, context, expected", [
    ("", {}, ""),
    ("users/${pod.namespace}", {"csi.storage.k8s.io/pod.namespace": "team-a"}, "users/team-a"),
    ("${serviceAccount.name}/${pod.name}", {"csi.storage.k8s.io/serviceAccount.name": "sa",
                                            "csi.storage.k8s.io/pod.name": "p-0"}, "sa/p-0"),
])
def test_sub_path_variables_come_from_pod_info(template, context, expected):
    assert resolve_sub_path(template, context) == expected


def test_sub_path_variable_cannot_climb_out_of_the_volume():
    with pytest.raises(CsiError, match="cannot be used as a directory name"):
        resolve_sub_path("users/${pod.namespace}", {"csi.storage.k8s.io/pod.namespace": ".."})


def test_credentials_never_show_in_their_repr():
    credentials = parse_credentials({"accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "s3cr3t",
                                     "sessionToken": "t0ken"})
    assert credentials is not None
    assert credentials.environment() == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
                                         "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                                         "AWS_SESSION_TOKEN": "t0ken"}
    for text in (repr(credentials), str(credentials)):
        assert "AKIAEXAMPLE" not in text and "s3cr3t" not in text and "t0ken" not in text
    assert parse_credentials({}) is None


def test_owner_and_mode_attributes_and_the_pods_fs_group():
    spec, _ = parse_volume_context({"source": "s3://b", "uid": "1000", "fileMode": "0640",
                                    "listingAttrs": "true"}, read_only=False)
    assert spec.mount_flags() == ["--file-mode", "0640", "--listing-attrs", "--uid", "1000"]
    assert with_mount_group(spec, "2000").mount_flags() == [
        "--dir-mode", "0775", "--file-mode", "0640", "--gid", "2000", "--listing-attrs",
        "--uid", "1000"]
    explicit, _ = parse_volume_context({"source": "s3://b", "gid": "7"}, read_only=False)
    assert with_mount_group(explicit, "2000") == explicit
    for attribute, value in (("fileMode", "0999"), ("uid", "-1"), ("dirMode", "rwx")):
        with pytest.raises(CsiError, match=f"volumeAttributes.{attribute}"):
            parse_volume_context({"source": "s3://b", attribute: value}, read_only=False)
def test_metrics_addr_attribute_is_checked_like_the_flag():
    spec, _ = parse_volume_context({"source": "s3://b", "metricsAddr": "0.0.0.0:9100"},
                                   read_only=False)
    assert spec.mount_flags() == ["--metrics-addr", "0.0.0.0:9100"]
    with pytest.raises(CsiError, match="volumeAttributes.metricsAddr: must be HOST:PORT"):
        parse_volume_context({"source": "s3://b", "metricsAddr": "9100"}, read_only=False)
