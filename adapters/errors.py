"""Errors a dataset user can act on, each with a message that names the file or path at fault."""

from __future__ import annotations

from avafs.reader.manifest import ManifestError

__all__ = ["EmptyDatasetError", "ManifestError", "ShardFormatError"]


class EmptyDatasetError(ValueError):
    """A source produced no samples: training on it would silently do nothing."""


class ShardFormatError(ValueError):
    """A shard file is truncated or corrupt; the message names the shard and the byte offset."""
