"""What the store must become for one key: the unit of write-back.

Write-back keeps, per key, the state the store has to reach (new data, a deletion, or a copy of
another key's version), not a log of operations: a newer state replaces an older one, so an old
upload can never overwrite newer data and a deleted file is never uploaded. Ordering between keys
(a rename's delete of its source must follow the copy that reads it) is `wait_for`.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..stores.base import MultipartUploads, ObjectInfo, Part
from ..stores.metadata import Attrs

DATA = "data"
DELETED = "deleted"
COPY = "copy"


class Stream:
    """One file's multipart upload in progress."""

    def __init__(self, uploads: MultipartUploads, source: str, key: str, fd: int,
                 created: Future[str], mtime: float | None, attrs: Attrs | None) -> None:
        self.uploads = uploads
        self.source = source
        self.key = key
        self.fd = fd
        """The data file, read by parts: open, it outlives an unlink or a rename of the file."""
        self.created = created
        """The upload id, once the store answered."""
        self.mtime = mtime
        self.attrs = attrs
        """What the upload's object carries (see `MultipartUploads.start_upload`)."""
        self.sent = 0
        """Bytes handed to parts: a write below this cancels the stream."""
        self.parts: list[Future[Part]] = []
        self.cancelled = False


@dataclass(eq=False)
class Pending:
    source: str
    key: str
    kind: str
    seq: int
    size: int = 0
    mtime: float = field(default_factory=time.time)
    file: str | None = None
    """The local data file (DATA); None is an empty object, e.g. a directory marker."""
    copy_from: str | None = None
    copy_etag: str | None = None
    wait_for: tuple[str, ...] = ()
    attrs: Attrs | None = None
    """Mode and owner the store must get with `mtime` (DATA: always, unset fields left out;
    COPY: where not None, else the copy keeps the source's). A COPY onto its own key is a
    change of attributes alone: the store copies the object onto itself."""
    staged: str | None = None
    """Under --writeback cluster, the id of this state's record in the cluster's queue
    (cluster/queue.py); None while it is only node-durable."""
    # Not journaled: the state of this daemon's work on the entry.
    durable: bool = False
    writers: int = 0
    generation: int = 0
    changed_at: float = field(default_factory=time.monotonic)
    attempts: int = 0
    next_attempt: float = 0.0
    uploading: bool = False
    upload_slot: tuple[str, str] | None = None
    """The (source, key) the upload in flight writes: a rename may move the entry meanwhile."""
    awaited: bool = False
    """A close() waits for this upload (--writeback sync): upload it though still open."""
    copy_in: bool = False
    """A copy whose source is changed by a state that waits, through other copies, for this
    copy (files swapped by renames): the uploader copies the source's version into a data
    file instead (`WriteBack.copy_in_source`), which ends the cycle."""
    mtime_set: bool = False
    """The mtime was set (utime, touch) since the last write: a stream begun while the file
    was written carries no mtime, and then needs the copy that sets it."""
    appended_to: int | None = None
    """Where the writes so far end, while they came front to back (each starting at or before
    the end of the previous ones); None once one skipped ahead or a stream was cancelled."""
    stream: Stream | None = None
    """The upload of this file in progress while it is written (see streaming.py)."""
    cluster_stream: Stream | None = None
    """Under --writeback cluster, the upload of this file to its staging object in the
    cluster store while it is written (cluster/streams.py); the stage completes it."""
    stored_generation: int | None = None
    """The generation the store has while the file is still open (--writeback sync uploads at
    every fsync): the entry stays the key's state, as its writer may go on, and settles at its
    last close if nothing changed since."""
    stored_info: ObjectInfo | None = None
    set_aside: str | None = None
    """The store's answer when it refused this state for good (a permanent error): the entry
    stays pending and journaled, its data kept, but no longer retried on its own."""
    cancelled: bool = False
    """No longer the key's state (replaced or removed): an upload of it in flight stops."""
    staged_generation: int | None = None
    """The generation `staged` holds; the state needs staging again while it differs."""
    staged_bytes: int = 0
    """The bytes of the staging object `staged` names (counted in `WriteBack.staged_bytes`)."""
    staged_data_current: bool = False
    """Whether the staging object of `staged` holds the data file as it is (no write or
    truncate since): a rename or a change of attributes then stages a record naming that
    object again, sending no data."""
    allocated: int | None = None
    """What the data file takes on disk, measured, once a write or truncate left a hole in it;
    None while it has none, when that is its length rounded up to whole disk blocks."""

    @property
    def slot(self) -> tuple[str, str]:
        return self.source, self.key

    def record(self) -> bytes:
        return json.dumps({
            "source": self.source, "key": self.key, "kind": self.kind, "seq": self.seq,
            "size": self.size, "mtime": self.mtime, "file": self.file,
            "copy_from": self.copy_from, "copy_etag": self.copy_etag,
            "wait_for": list(self.wait_for), "staged": self.staged,
            "attrs": None if self.attrs is None else self.attrs.fields(),
        }).encode()

    @classmethod
    def from_record(cls, raw: bytes) -> Pending:
        fields = json.loads(raw)
        fields["wait_for"] = tuple(fields["wait_for"])
        if fields.get("attrs") is not None:
            fields["attrs"] = Attrs(*fields["attrs"])
        return cls(**fields, durable=True,
                   staged_generation=0 if fields.get("staged") else None)


def journal_key(source: str, key: str) -> bytes:
    return f"{source}\0{key}".encode()
