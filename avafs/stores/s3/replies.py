"""What S3Store and its parts read out of botocore's replies and errors."""

from __future__ import annotations

import botocore.exceptions


def error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def unquoted_etag(raw: str) -> str:
    return raw.strip('"')
