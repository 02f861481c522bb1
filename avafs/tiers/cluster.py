"""The cluster tier: blocks kept in a bucket of an S3-compatible store inside the cluster,
shared by every node, between the node's disk tier and the source (`--cluster-cache`).

Names. A block is `blocks/<block size>/<h>` where `h` hashes its BlockId (source URL, key,
ETag, index): a changed object has a new ETag, so its blocks have new names and a stale block
is never found. Each block carries its length and CRC-32C (`google-crc32c`, the CPU's own
instruction where it has one: a node reading from the tier sums every block it gets) in its
metadata; a block that does not match them (torn, truncated, overwritten) is a miss, and the
next fill replaces it. Blocks filled before CRC-32C carry a CRC-32 and are checked with it.

Fills. A block read from the source is written here in the background by FILL_THREADS
threads from a queue bounded in bytes (FILL_MEMORY); a block that does not fit is dropped
and counted, never waited for: a reader never waits for the cluster store.

Who reads the source. Before reading a missing block from the source a node creates its
`filling/<block size>/<h>` marker with If-None-Match: *; the store lets one node win. The
winner reads the source and fills the block, then deletes the marker. The others poll for
the block while the marker stands, for at most FILL_WAIT seconds, and read the source
themselves when it does not come: the marker vanished without a block (the fill was
dropped or failed), or it is older than FILL_WAIT by the store's clock (its node died; a
stale marker is deleted so the next claim succeeds). A node claims every block of a run
before it reads any and waits for other nodes' blocks only after reading its own, so two
nodes that claimed parts of one run never wait on each other.

Failure. The tier is a cache: a read (a GET or a marker's HEAD) that fails, after one try
with `--cluster-timeout`, sends the block to the source and turns the tier off for
PAUSE_AFTER_ERROR seconds, so a store that is down costs one timeout per pause, not one per
block. Writes are timed apart from reads: a PUT can be slow where GETs are quick (a store
that grows a fresh bucket's volumes on demand makes its first writes wait). A block's write (a
background fill, which no reader waits for) may take FILL_TIMEOUT seconds, and one that still
fails pauses only fills and claims: pausing reads for it would send to the source blocks the
tier holds. Claims pause with fills because a node that cannot fill must not claim: its
markers would make other nodes wait for blocks it drops. A claim blocks a reader, so it keeps
the read limit. A claim that fails sends its block to the source (the node still fills it),
and claims pause only once CLAIM_FAILURES_IN_A_ROW have failed with none answered between
them: a store busy for a moment answers one request late among hundreds, and a pause would
send every block this node misses for seconds to the source unclaimed, while other nodes
read the same blocks there. At mount a fill thread writes (and deletes) a key of its own
with the fill limit, so a fresh bucket grows before the first epoch's writes; claims wait for
that write for at most the read limit after the mount, and are skipped (the source read, the
block filled) while it is still under way. A claim whose request failed may still have
created its marker (a store that answered too late), and a marker due for deletion while the
tier is off or whose delete failed stays: all are left-overs, deleted by the fill threads
while claims are on (a failed delete pauses claims at once: the marker it leaves makes other
nodes wait), so other nodes do not wait FILL_WAIT on a block this node will never fill. (A
claim that is only retried, not left over, would find its own marker and take it for another
node's.) The tier's requests skip botocore's own CRC32 of each block
(`ClusterBucket.for_blocks`): the block's checksum in its metadata is checked here; for the
same reason a block's GET goes without botocore's per-request machinery (stores/s3/lean.py):
a node reading from the tier sends one request per block, so that machinery's CPU per request
is paid per block served.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import google_crc32c

from ..errors import StoreError
from ..metrics import Metrics
from ..objects import BlockId

if TYPE_CHECKING:  # boto3 is optional, and only a mount with a cluster tier needs it
    from ..stores.s3.cluster_bucket import ClusterBucket

log = logging.getLogger(__name__)

FILL_MEMORY = 64 * 2**20
"""Bytes of blocks waiting to be written to the cluster store; more are dropped."""
FILL_THREADS = 2
LOOKUP_THREADS = 4
"""GETs of one piece of a stream sent at the same time (`get_all`): a block of the tier costs
a request's round trip more than one of the disk tier, and lookups side by side hide it."""
FILL_WAIT = 10.0
"""Longest wait for a block another node is filling, and the age past which its marker is
taken for the mark of a node that died."""
PAUSE_AFTER_ERROR = 5.0
CLAIM_FAILURES_IN_A_ROW = 2
"""Claims that fail one after another, none answered between them, before claims pause."""
FILL_TIMEOUT = 30.0
"""Seconds a block's write (or the mount's first write) may take besides its transfer: no
reader waits for it, and a fresh bucket's first writes wait for its volumes to be made."""
CLOSE_WAIT = 20.0
"""Seconds `close` goes on writing queued blocks before it drops the rest: with writes of up
to FILL_TIMEOUT each, a slow store would otherwise hold an unmount for minutes."""
_FIRST_POLL = 0.02
_LAST_POLL = 0.2
_SIZE = "avafs-size"
_CRC32C = "avafs-crc32c"
_CRC32 = "avafs-crc32"
"""The checksum of blocks filled before CRC-32C."""


class ClusterTier:
    name = "cluster"

    def __init__(self, bucket: ClusterBucket, block_size: int, metrics: Metrics,
                 fill_memory: int = FILL_MEMORY, fill_wait: float = FILL_WAIT,
                 fill_timeout: float = FILL_TIMEOUT, close_wait: float = CLOSE_WAIT) -> None:
        self.bucket = bucket.for_blocks()
        self._writer = self.bucket.for_blocks(fill_timeout)
        """Fills and the mount's first write, with the longer limit (module docstring)."""
        self.url = bucket.url
        self.block_size = block_size
        self.metrics = metrics
        self.fill_memory = fill_memory
        self.fill_wait = fill_wait
        self.close_wait = close_wait
        self._write_until = float("inf")
        """When fills stop being written (`close`)."""
        self.bucket.prepare_clients(block_size)
        self._writer.prepare_clients(block_size)
        self._node = socket.gethostname().encode() or b"avafs"
        self.prepared = threading.Event()
        """Set once the mount's first write is done (or failed)."""
        self._prepare_deadline = time.monotonic() + bucket.timeout
        self._lock = threading.Lock()
        self._claimed: set[BlockId] = set()
        self._claims_failed = 0
        """Claims failed since one was last answered (won or lost)."""
        self._left_over: set[BlockId] = set()
        """Markers this node may have left in the store (see the module docstring)."""
        self._queued_bytes = 0
        self._fills: queue.Queue[tuple[BlockId, bytes | None] | None] = queue.Queue()
        self._down_until = 0.0
        self._fills_down_until = 0.0
        self._claims_down_until = 0.0
        self.last_error: str | None = None
        metrics.cluster_fill_queue.set_function(lambda: self.queued_bytes)
        self._lookups = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="avafs-cluster-get")
        self._threads = [threading.Thread(target=self._fill_in_background, args=(number == 0,),
                                          daemon=True, name=f"avafs-cluster-fill-{number}")
                         for number in range(FILL_THREADS)]
        for thread in self._threads:
            thread.start()

    def _name(self, block: BlockId) -> str:
        return f"{self.block_size}/{block.file_name()}"

    def block_key(self, block: BlockId) -> str:
        return f"blocks/{self._name(block)}"

    def marker_key(self, block: BlockId) -> str:
        return f"filling/{self._name(block)}"

    @property
    def queued_bytes(self) -> int:
        """Bytes of blocks waiting to be written."""
        return self._queued_bytes

    @property
    def busy(self) -> bool:
        """Whether fills are queued or claims held (what `close` would still finish)."""
        with self._lock:
            return bool(self._queued_bytes or self._claimed)

    @property
    def reachable(self) -> bool:
        """Whether the tier is read (and markers deleted)."""
        return time.monotonic() >= self._down_until

    @property
    def filling(self) -> bool:
        """Whether blocks are written and claimed (see the module docstring)."""
        return self.reachable and time.monotonic() >= self._fills_down_until

    @property
    def claiming(self) -> bool:
        """Whether blocks are claimed before the source is read (see the module docstring)."""
        return self.filling and time.monotonic() >= self._claims_down_until

    def _failed(self, kind: str, error: StoreError, pause: bool = True) -> None:
        """Count a failed request; unless `pause` is False, one that may pass turns the tier
        off for a while, or only its fills and claims when it was a block's write ("put"), or
        only its claims when it was a marker's ("claim")."""
        self.metrics.cluster_errors.labels(kind).inc()
        self.last_error = str(error)
        if error.permanent:
            log.warning("cluster tier: %s", error)
        elif not pause:
            log.warning("cluster tier: %s; reading this block from the source", error)
        elif kind == "put":
            if self.filling:
                log.warning("cluster tier: %s; not filling it for %.0f s", error,
                            PAUSE_AFTER_ERROR)
            self._fills_down_until = time.monotonic() + PAUSE_AFTER_ERROR
        elif kind == "claim":
            if self.claiming:
                log.warning("cluster tier: %s; not claiming blocks for %.0f s", error,
                            PAUSE_AFTER_ERROR)
            self._claims_down_until = time.monotonic() + PAUSE_AFTER_ERROR
        else:
            if self.reachable:
                log.warning("cluster tier: %s; reading from the source for %.0f s", error,
                            PAUSE_AFTER_ERROR)
            self._down_until = time.monotonic() + PAUSE_AFTER_ERROR

    # --- reads -----------------------------------------------------------------------------

    def get(self, block: BlockId, size: int) -> bytes | None:
        """The block's `size` bytes if the tier holds them intact; else None. A miss is
        counted when the block read from the source instead is handed to `fill`."""
        data = self._get(block, size)
        if data is not None:
            self.metrics.tier_hits["cluster"].inc()
        return data

    def _get(self, block: BlockId, size: int) -> bytes | None:
        if not self.reachable:
            return None
        try:
            found = self.bucket.get_object(self.block_key(block), size)
        except StoreError as error:
            self._failed("get", error)
            return None
        if found is None:
            return None
        data, metadata = found
        if len(data) != size or metadata.get(_SIZE) != str(size) or not _intact(data, metadata):
            self.metrics.cluster_errors.labels("corrupt").inc()
            log.warning("cluster tier: block %d of %s is damaged (%d bytes, %d expected); "
                        "reading it from the source", block.index, block.key, len(data), size)
            return None
        return data

    def claim(self, block: BlockId) -> bool:
        """Whether this node is to read the block from the source: it created the block's
        marker, or claims are off or not yet ready (the mount's first write, see the module
        docstring); False while another node is filling it (`wait_for`)."""
        if not self.claiming:
            return True
        if not (self.prepared.wait(max(0.0, self._prepare_deadline - time.monotonic()))
                and self.claiming):
            return True
        try:
            won = self.bucket.create_if_absent(self.marker_key(block), self._node)
        except StoreError as error:
            with self._lock:
                self._claims_failed += 1
                in_a_row = self._claims_failed
                if not error.permanent:
                    self._left_over.add(block)
            self._failed("claim", error, pause=in_a_row >= CLAIM_FAILURES_IN_A_ROW)
            return True
        with self._lock:
            self._claims_failed = 0
            if won:
                self._claimed.add(block)
        return won

    def get_all(self, blocks: list[tuple[BlockId, int]]) -> list[bytes | None]:
        """`get` of each (block, size), LOOKUP_THREADS at a time, in order."""
        return list(self._lookups.map(lambda item: self.get(*item), blocks))

    def get_or_claim(self, block: BlockId, size: int) -> tuple[bytes | None, bool]:
        """The block if the tier holds it; else whether this node is to read it from the
        source (`claim_missing`)."""
        data = self.get(block, size)
        if data is not None:
            return data, False
        return self.claim_missing(block, size)

    def claim_missing(self, block: BlockId, size: int) -> tuple[bytes | None, bool]:
        """After a miss: whether this node is to read the block from the source (`claim`),
        or the block itself. A won claim looks once more: the node that filled the block may
        have removed its marker between this node's look and its claim."""
        if not self.claim(block):
            return None, False
        data = self.get(block, size)
        if data is not None:
            self.release(block)
        return data, data is None

    def wait_for(self, block: BlockId, size: int) -> bytes | None:
        """The block once the node that claimed it has filled it; None when it will not come
        (see the module docstring), and the caller reads the source."""
        deadline = time.monotonic() + self.fill_wait
        pause = _FIRST_POLL
        while self.reachable:
            try:
                age = self.bucket.age(self.marker_key(block))
            except StoreError as error:
                self._failed("get", error)
                break
            data = self._get(block, size)
            if data is not None:
                self.metrics.tier_hits["cluster"].inc()
                self.metrics.cluster_waits.inc()
                return data
            if age is None:
                break
            if age > self.fill_wait:
                self._delete_marker(block)
                break
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, _LAST_POLL)
        return None

    def read_through(self, block: BlockId, size: int, read_source: Callable[[], bytes]
                     ) -> tuple[bytes, bool]:
        """The block from this tier, else from `read_source` (then filled behind by the
        caller, see `fill`); and whether the source was read."""
        data, claimed = self.get_or_claim(block, size)
        if data is None and not claimed:
            data = self.wait_for(block, size)
        if data is not None:
            return data, False
        try:
            return read_source(), True
        except BaseException:
            self.release(block)
            raise

    # --- fills -----------------------------------------------------------------------------

    def fill(self, block: BlockId, data: bytes) -> None:
        """Write a block read from the source (a miss of this tier), in the background;
        dropped (and counted) when the queue holds FILL_MEMORY bytes or fills are off."""
        self.metrics.cluster_misses.inc()
        with self._lock:
            admitted = self.filling and self._queued_bytes + len(data) <= self.fill_memory
            if admitted:
                self._queued_bytes += len(data)
        if admitted:
            self._fills.put((block, data))
            return
        self.metrics.cluster_fills_dropped.inc()
        self.release(block)

    def release(self, block: BlockId) -> None:
        """Give up a claim without filling the block: its marker goes, so the nodes waiting
        for it read the source now instead of after FILL_WAIT."""
        with self._lock:
            if block not in self._claimed:
                return
        self._fills.put((block, None))

    def fill_now(self, block: BlockId, data: bytes) -> None:
        """Write a block in this thread (warmup); raises StoreError when the store fails."""
        self._writer.put_object(self.block_key(block), data,
                               {_SIZE: str(len(data)),
                                _CRC32C: f"{google_crc32c.value(data):08x}"})
        self.metrics.cluster_fills.inc()
        self.metrics.cluster_fill_bytes.inc(len(data))

    def holds(self, block: BlockId, size: int) -> bool:
        """Whether the tier holds the block intact (warmup's check; reads it)."""
        return self._get(block, size) is not None

    def _prepare(self) -> None:
        """The mount's first write: a key of this node's, written and deleted with the fill
        limit, so a fresh bucket's volumes are made before the first epoch's writes. Not
        empty: a store that grows volumes on demand grows them only for data."""
        key = f"prepared/{self._node.decode()}"
        try:
            self._writer.put_object(key, self._node, {})
            self._writer.delete(key)
        except StoreError as error:
            self._failed("put", error)
        finally:
            self.prepared.set()

    def _fill_in_background(self, prepare: bool) -> None:
        if prepare:
            self._prepare()
        while True:
            try:
                item = self._fills.get(timeout=PAUSE_AFTER_ERROR)
            except queue.Empty:
                self._delete_left_overs()
                continue
            if item is None:
                return
            block, data = item
            self._delete_left_overs()
            try:
                if data is not None:
                    try:
                        if self.filling and time.monotonic() < self._write_until:
                            self.fill_now(block, data)
                        else:
                            self.metrics.cluster_fills_dropped.inc()
                    except StoreError as error:
                        self._failed("put", error)
                    finally:
                        with self._lock:
                            self._queued_bytes -= len(data)
                with self._lock:
                    mine = block in self._claimed
                    self._claimed.discard(block)
                if mine:
                    self._delete_marker(block)
            except Exception:  # noqa: BLE001 - a fill thread must outlive any one block
                log.exception("cluster tier: filling block %d of %s failed", block.index,
                              block.key)

    def _delete_marker(self, block: BlockId) -> bool:
        """Delete the block's marker; False when it is kept as a left-over: the tier is off
        or the delete failed (which pauses claims)."""
        if self.reachable:
            try:
                self.bucket.delete(self.marker_key(block))
                return True
            except StoreError as error:
                self._failed("claim", error)
        with self._lock:
            self._left_over.add(block)
        return False

    def _delete_left_overs(self) -> None:
        """Delete the markers left over while claims are on (one fill thread's turn); the
        first that fails ends the turn, so a store that refuses deletes costs one request per
        turn, not a loop."""
        while self.claiming:
            with self._lock:
                if not self._left_over:
                    return
                block = self._left_over.pop()
            if not self._delete_marker(block):
                return

    def close(self) -> None:
        """Write what is queued for at most `close_wait` seconds (and the writes then under
        way, each bounded by the fill limit), drop the rest (counted), then stop."""
        self._write_until = time.monotonic() + self.close_wait
        self._lookups.shutdown()
        for _ in self._threads:
            self._fills.put(None)
        for thread in self._threads:
            thread.join()


def _intact(data: bytes, metadata: dict[str, str]) -> bool:
    """Whether the block's bytes match the checksum in its metadata (CRC-32C, or the CRC-32 of
    a block filled before it)."""
    if _CRC32C in metadata:
        return metadata[_CRC32C] == f"{google_crc32c.value(data):08x}"
    return metadata.get(_CRC32) == f"{zlib.crc32(data):08x}"
