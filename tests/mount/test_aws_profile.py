"""`--profile NAME`: the sources' credentials from an AWS profile, as the AWS tools take them,
with nothing in the environment; a missing profile, or one beside AWS_ACCESS_KEY_ID, is one
line, and the keys are printed nowhere."""

from __future__ import annotations

import pytest
from support import TEST_CREDENTIALS, run_avafs, write_aws_profile


@pytest.fixture
def profile_only(tmp_path, monkeypatch, s3_server, bucket) -> str:
    """The test bucket, whose keys are only in the AWS profile `datasets` of a config file."""
    s3_server.client().put_object(Bucket=bucket, Key="train/0.bin", Body=b"sample")
    config = write_aws_profile(tmp_path / "aws-config", "datasets")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return bucket


def test_the_sources_credentials_come_from_the_profile(profile_only, s3_server, mount, tmp_path):
    mnt = mount(f"s3://{profile_only}", "--endpoint-url", s3_server.endpoint,
                "--profile", "datasets")
    assert (mnt / "train" / "0.bin").read_bytes() == b"sample"
    log = (tmp_path / "cache" / "avafs.log").read_text()
    assert TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in log


def test_a_missing_profile_or_one_beside_the_key_variables_is_one_line(profile_only, s3_server,
                                                                       tmp_path, monkeypatch):
    (tmp_path / "mnt").mkdir()
    arguments = (f"s3://{profile_only}", str(tmp_path / "mnt"), "--endpoint-url",
                 s3_server.endpoint, "--cache-dir", str(tmp_path / "cache"))
    missing = run_avafs("mount", *arguments, "--profile", "dataset")
    assert missing.returncode == 1
    assert missing.stderr == ("avafs: error: AWS profile 'dataset' not found: check --profile "
                              "and ~/.aws/config\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"])
    both = run_avafs("mount", *arguments, "--profile", "datasets")
    assert both.returncode == 1
    assert both.stderr == ("avafs: error: both --profile and AWS_ACCESS_KEY_ID are set: keep "
                           "one\n")
    assert not (tmp_path / "cache").exists()
