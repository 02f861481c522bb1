"""AWS profiles: the named credentials of ~/.aws/config and ~/.aws/credentials that `--profile`
(the sources') and `--cluster-profile` (the cluster tier's) choose."""

from __future__ import annotations

import os

import boto3
import botocore.exceptions
import botocore.session

from ...errors import AvafsError


def profile_session(profile: str | None, option: str,
                    core: botocore.session.Session | None = None) -> boto3.session.Session:
    """A boto3 session with `profile`'s credentials (None: the AWS chain's); a profile the AWS
    files do not name is a one-line error that names `option`."""
    try:
        return boto3.session.Session(profile_name=profile, botocore_session=core)
    except botocore.exceptions.ProfileNotFound:
        raise AvafsError(f"AWS profile {profile!r} not found: check {option} and "
                         "~/.aws/config") from None


def use_source_profile(profile: str) -> None:
    """`--profile`: this process, and the daemon it starts, take the sources' credentials from
    `profile` through AWS_PROFILE, which every boto3 session given no credentials of its own
    reads (the cluster tier's without --cluster-profile too, as its help says). The access key
    variables would win over it in the AWS chain, so both set is refused rather than ignored."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        raise AvafsError("both --profile and AWS_ACCESS_KEY_ID are set: keep one")
    profile_session(profile, "--profile")
    os.environ["AWS_PROFILE"] = profile
