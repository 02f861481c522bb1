"""S3 multipart uploads, a part of S3Store (store.py): the write-back streams a large file's
parts as they are written (`MultipartUploads`), and S3Store's own large PUTs and copies are
managed transfers of the same part size (TRANSFER).

The methods use the store's clients and its way of turning botocore's failures into
StoreErrors (`_client`, `_sized`, `_store_errors`, `bucket`, `prefix`), which S3Store sets up.
"""

from __future__ import annotations

import time

import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from .. import metadata
from ..base import MultipartUploads, ObjectInfo, Part
from ..metadata import Attrs
from .lean import sends_crc32
from .replies import error_code, unquoted_etag

TRANSFER = TransferConfig(multipart_threshold=64 * 2**20, multipart_chunksize=8 * 2**20,
                          max_concurrency=8, use_threads=True)
"""Eight 8 MiB parts in flight (64 MiB of buffers per large upload, as four 16 MiB parts were):
more requests in flight is what a single large upload needs to fill the link (the direct
upload's baseline uses the same)."""
PART = TRANSFER.multipart_chunksize
"""Completing an upload, whose work at the server grows with the object, gets the time of one
part's transfer on top of the base limit."""


class S3MultipartUploads(MultipartUploads):
    def multipart(self) -> MultipartUploads:
        return self

    def _checksum(self) -> dict[str, str]:
        """CRC32 part checksums where the client computes them by default, as s3transfer does
        (a part sent with a checksum must be completed with it)."""
        if sends_crc32(self._client):
            return {"ChecksumAlgorithm": "CRC32"}
        return {}

    def start_upload(self, key: str, mtime: float | None = None,
                     attrs: Attrs | None = None) -> str:
        extra: dict[str, object] = {**self._checksum()}
        if attrs is not None:
            extra["Metadata"] = metadata.encode(mtime, attrs)
        with self._store_errors(f"multipart upload of {key!r}"):
            return self._client.create_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + key, **extra)["UploadId"]

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> Part:
        with self._store_errors(f"part {number} of {key!r}"):
            reply = self._sized(len(data)).upload_part(Bucket=self.bucket, Key=self.prefix + key,
                                             UploadId=upload_id, PartNumber=number, Body=data,
                                             **self._checksum())
        part: Part = {"PartNumber": number, "ETag": reply["ETag"]}
        if "ChecksumCRC32" in reply:
            part["ChecksumCRC32"] = reply["ChecksumCRC32"]
        return part

    def complete_upload(self, key: str, upload_id: str, parts: list[Part],
                        size: int) -> ObjectInfo:
        with self._store_errors(f"completing the upload of {key!r}"):
            reply = self._sized(PART).complete_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + key, UploadId=upload_id,
                MultipartUpload={"Parts": parts})
        return ObjectInfo(key, size, unquoted_etag(reply["ETag"]), time.time())

    def abort_upload(self, key: str, upload_id: str) -> None:
        """An upload that no longer exists (completed or aborted already) is not an error."""
        with self._store_errors(f"aborting the upload of {key!r}"):
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=self.prefix + key,
                                                    UploadId=upload_id)
            except botocore.exceptions.ClientError as error:
                if error_code(error) not in ("NoSuchUpload", "404"):
                    raise

    def uploads_of(self, key: str) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        with self._store_errors(f"listing the multipart uploads of {key!r}"):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix + key)
            for page in pages:
                found.extend((upload["UploadId"], upload["Initiated"].timestamp())
                             for upload in page.get("Uploads", ())
                             if upload["Key"] == self.prefix + key)
        return found
