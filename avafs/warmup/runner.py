"""Warmup jobs and prefetch hints: filling the cache ahead of the readers.

A warmup is planned before it starts: the files are listed, what is already cached is counted,
and if the rest does not fit under the tier's high watermark only what fits is loaded, so a
warmup never evicts what it has just loaded. Blocks, not files, are the unit of parallel work,
so one large file is warmed as fast as many small ones, and progress counts bytes as each block
is loaded, so a large file's progress moves while it loads. Prefetch hints use only fetch slots
that demand reads leave free.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ..errors import NEW_OBJECTS_HINT, AvafsError, StoreError
from ..metrics import Metrics
from ..namespace import Namespace
from ..objects import ObjectRef
from ..snapshots.store import SnapshotStore
from ..stores.base import ObjectInfo
from ..tiers.stack import TierStack

log = logging.getLogger(__name__)

_MAX_LISTED_FAILURES = 100


@dataclass
class WarmupState:
    """Progress of one warmup, as `avafs status` and the warmup command show it."""

    id: int
    tier: str
    state: str = "planning"
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    files_already_cached: int = 0
    bytes_already_cached: int = 0
    files_skipped_for_space: int = 0
    bytes_skipped_for_space: int = 0
    files_failed: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """A file to warm: its path in the mount and what the tiers read; for a file of the
    mount's sources, its source and what its listing showed (`listed`), whose attributes a
    warmup may read on the way (`WarmupRunner._load_described`)."""

    path: str
    ref: ObjectRef
    source: str | None = None
    listed: ObjectInfo | None = None


def expand(namespace: Namespace, items: list[dict[str, str]],
           failures: list[tuple[str, str]]) -> list[Target]:
    """Files named by manifest-style items ({"path": ...} or {"url": ...}), directories
    expanded recursively, each file once; unresolvable items go to `failures`."""
    targets: dict[tuple[str, str], Target] = {}
    for item in items:
        name = item.get("path") or item.get("url") or ""
        try:
            path = item["path"] if "path" in item else namespace.path_of_url(item["url"])
            source, key, info = namespace.resolve(path)
        except (FileNotFoundError, KeyError):
            failures.append((name, f"not found in the mount ({NEW_OBJECTS_HINT})"))
            continue
        except IsADirectoryError as error:
            failures.append((name, str(error)))
            continue
        except AvafsError as error:
            failures.append((name, str(error)))
            continue
        infos: list[tuple[str, ObjectInfo]]
        if info is not None:
            infos = [(path.strip("/"), info)]
        else:
            root = f"{source}/" if not namespace.single_source else ""
            infos = [(f"{root}{found.key}", found) for found in namespace.walk(source, key)]
        for file_path, found in infos:
            targets.setdefault((source, found.key),
                               Target(file_path, namespace.object_ref(source, found), source,
                                      found))
    return list(targets.values())


def snapshot_targets(root: str, store: SnapshotStore) -> list[Target]:
    """Every file a snapshot records, as its recorded version (read through `store`), at its
    path in the mount (`root`: '' for a single-source mount, else the source's directory).
    Its blocks are named by the source's URL, as every block of the source is
    (`Namespace.object_ref`), so a mount of the source or of the snapshot finds them."""
    return [Target(f"{root}{file.key}",
                   ObjectRef(store.url, store, file.key, file.etag, file.size))
            for file in store.files()]


class WarmupRunner:
    def __init__(self, namespace: Namespace, stack: TierStack, metrics: Metrics) -> None:
        self.namespace = namespace
        self.stack = stack
        self.metrics = metrics
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._finished = threading.Condition()
        self.jobs: dict[int, WarmupState] = {}

    def start(self, items: list[dict[str, str]], threads: int, tier: str,
              targets: list[Target] | None = None) -> WarmupState:
        """Warm the files `items` name, or exactly `targets` where given (a snapshot's)."""
        if tier not in ("disk", "ram", "cluster"):
            raise AvafsError(f"invalid tier {tier!r}: use disk, ram or cluster")
        if tier == "cluster" and self.stack.cluster is None:
            raise AvafsError("--tier cluster: this mount has no cluster tier (mount it with "
                             "--cluster-cache s3://BUCKET[/prefix])")
        if threads < 1:
            raise AvafsError("invalid --threads: must be at least 1")
        state = WarmupState(next(self._ids), tier)
        with self._lock:
            self.jobs[state.id] = state
        threading.Thread(target=self._run, args=(state, items, threads, targets), daemon=True,
                         name=f"avafs-warmup-{state.id}").start()
        return state

    def check(self, items: list[dict[str, str]], tier: str) -> dict:
        """How much of the files named by `items` the tier holds, fetching nothing but the
        listings (`avafs warmup --check`)."""
        failures: list[tuple[str, str]] = []
        targets = expand(self.namespace, items, failures)
        result = {"tier": tier, "files_total": len(targets), "bytes_total": 0,
                  "files_cached": 0, "bytes_cached": 0,
                  "failures": [{"path": path, "error": error} for path, error in failures]}
        for target in targets:
            size = target.ref.size
            cached = sum(self.stack.block_length(target.ref, index)
                         for index in range(self.stack.block_count(target.ref))
                         if self.stack.is_cached(target.ref, index, tier))
            result["bytes_total"] += size
            result["bytes_cached"] += cached
            result["files_cached"] += cached == size
        return result

    def wait(self, state: WarmupState, timeout: float) -> None:
        """Until the warmup finishes or `timeout` passes, whichever is first (a warmup command
        reports progress in between, and returns as soon as its warmup is done)."""
        with self._finished:
            if state.finished_at is None:
                self._finished.wait(timeout)

    def running(self) -> list[WarmupState]:
        with self._lock:
            return [job for job in self.jobs.values() if job.finished_at is None
                    or time.time() - job.finished_at < 3600]

    def _run(self, state: WarmupState, items: list[dict[str, str]], threads: int,
             targets: list[Target] | None) -> None:
        try:
            self._plan_and_load(state, items, threads, targets)
            state.state = "failed" if state.files_failed else "done"
        except Exception as error:  # noqa: BLE001 - reported to the user through the status
            log.exception("warmup %d failed", state.id)
            state.failures.append({"path": "", "error": str(error)})
            state.state = "failed"
        finally:
            state.finished_at = time.time()
            with self._finished:
                self._finished.notify_all()
            log.info("warmup %d %s: %d files (%d bytes) loaded, %d already cached, %d skipped "
                     "for space, %d failed", state.id, state.state, state.files_done,
                     state.bytes_done, state.files_already_cached,
                     state.files_skipped_for_space, state.files_failed)

    def _fail(self, state: WarmupState, path: str, reason: str) -> None:
        state.files_failed += 1
        if len(state.failures) < _MAX_LISTED_FAILURES:
            state.failures.append({"path": path, "error": reason})

    def _plan_and_load(self, state: WarmupState, items: list[dict[str, str]],
                       threads: int, targets: list[Target] | None) -> None:
        failures: list[tuple[str, str]] = []
        if targets is None:
            targets = expand(self.namespace, items, failures)
        for path, reason in failures:
            self._fail(state, path, reason)
        if state.tier == "cluster":
            # Its capacity is the store's: nothing is planned for space, and a block the tier
            # already holds is skipped as it comes (TierStack.load_to_cluster).
            state.files_total = len(targets)
            state.bytes_total = sum(target.ref.size for target in targets)
            state.state = "running"
            self._load(state, targets, threads)
            return
        tier = self.stack.ram if state.tier == "ram" else self.stack.disk
        budget = int(tier.capacity * tier.high_watermark)
        to_load: list[Target] = []
        planned = 0
        for target in targets:
            state.files_total += 1
            state.bytes_total += target.ref.size
            blocks = range(self.stack.block_count(target.ref))
            if all(self.stack.is_cached(target.ref, index, state.tier) for index in blocks):
                state.files_already_cached += 1
                state.bytes_already_cached += target.ref.size
                planned += target.ref.size
            elif planned + target.ref.size <= budget:
                to_load.append(target)
                planned += target.ref.size
            else:
                state.files_skipped_for_space += 1
                state.bytes_skipped_for_space += target.ref.size
        if state.files_skipped_for_space:
            log.warning("warmup %d: %d bytes do not fit in the %s tier (%d bytes up to its high "
                        "watermark); warming only what fits", state.id, state.bytes_total,
                        state.tier, budget)
        state.state = "running"
        self._load(state, to_load, threads)

    def _load(self, state: WarmupState, targets: list[Target], threads: int) -> None:
        to_ram = state.tier == "ram"
        if state.tier == "cluster":
            fetch = self.stack.load_to_cluster
        else:
            def fetch(ref: ObjectRef, index: int) -> None:
                self.stack.load(ref, index, to_ram=to_ram)
        remaining = {target.path: self.stack.block_count(target.ref) for target in targets}
        failed: set[str] = set()
        lock = threading.Lock()

        def load_block(target: Target, index: int) -> None:
            try:
                if state.tier != "disk" or not self._load_described(target):
                    fetch(target.ref, index)
                error = None
            except Exception as problem:  # noqa: BLE001 - one file's failure is reported
                error = str(problem) or type(problem).__name__
            with lock:
                if error and target.path not in failed:
                    failed.add(target.path)
                    self._fail(state, target.path, error)
                if not error:
                    loaded = self.stack.block_length(target.ref, index)
                    state.bytes_done += loaded
                    self.metrics.warmup_bytes.inc(loaded)
                remaining[target.path] -= 1
                if remaining[target.path] == 0 and target.path not in failed:
                    state.files_done += 1
                    self.metrics.warmup_files.inc()

        with ThreadPoolExecutor(threads, thread_name_prefix=f"avafs-warmup-{state.id}") as pool:
            for target in targets:
                if target.ref.size == 0:
                    state.files_done += 1
                    self.metrics.warmup_files.inc()
                    continue
                for index in range(self.stack.block_count(target.ref)):
                    pool.submit(load_block, target, index)


    def _load_described(self, target: Target) -> bool:
        """A small file whose attributes no one has read yet, loaded by the GET that reads
        them too, sent from the request loop (`TierStack.fetch_described`, as a lookup does):
        the namespace keeps them, so the first `stat` of each warmed file sends no HEAD.
        False where the file was not loaded so; the caller loads it as any block then."""
        listed = target.listed
        if listed is None or listed.attrs is not None or target.source is None or \
                self.namespace.known is None or self.namespace.describe_paused():
            return False
        try:
            found = self.stack.request_loop.run(self.stack.fetch_described, listed, target.ref)
        except StoreError:
            return False  # one try from the loop: the load's own tries say what it is
        if found is None:
            return False
        self.namespace.learned(target.source, listed, found)
        return True


class Prefetcher:
    """Background loading of hinted files, at lower priority than reads and warmups."""

    def __init__(self, namespace: Namespace, stack: TierStack, workers: int = 2) -> None:
        self.namespace = namespace
        self.stack = stack
        self.queued = 0
        self.done = 0
        self.failed = 0
        self._queue: queue.Queue[dict[str, str]] = queue.Queue()
        for number in range(workers):
            threading.Thread(target=self._work, daemon=True,
                             name=f"avafs-prefetch-{number}").start()

    def submit(self, items: list[dict[str, str]]) -> int:
        for item in items:
            self._queue.put(item)
        self.queued += len(items)
        return len(items)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            failures: list[tuple[str, str]] = []
            try:
                for target in expand(self.namespace, [item], failures):
                    for index in range(self.stack.block_count(target.ref)):
                        if self.stack.is_cached(target.ref, index, "ram"):
                            continue
                        while not self.stack.load(target.ref, index, to_ram=True, wait=False):
                            time.sleep(0.01)
                self.done += 1
            except Exception as error:  # noqa: BLE001 - a hint is best effort, but logged
                self.failed += 1
                log.warning("prefetch of %s failed: %s", item, error)
            if failures:
                self.failed += 1
                log.warning("prefetch of %s failed: %s", *failures[0])
