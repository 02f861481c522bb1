"""The mount daemon: build the data path, mount it, serve until unmounted or signalled.

`avafs mount` starts this in a detached process and returns only when it reports the mount
usable (or the one-line reason it is not) through an inherited pipe, so scripts and the CSI
driver never race a half-made mount. The same code runs attached with `--foreground`.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import logging.handlers
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import prometheus_client
import uvloop

from .batch_reads.generation import InPlaceWatch
from .batch_reads.serve import KEEP_LOCATIONS_FOR
from .batch_reads.snapshot import LocationSnapshot
from .config.cache_dir import (
    ATTRIBUTES_DIR,
    DISK_TIER_DIR,
    LOCATIONS_FILE,
    LOCK_FILE,
    PID_FILE,
    PRIVATE_UMASK,
    WRITEBACK_DIR,
    open_log_for_append,
    prepare_cache_dir,
    remove_unused,
)
from .config.free_space import disk_cache_warning
from .config.options import MountOptions
from .control.operations import ControlOperations
from .control.server import ControlServer
from .control.status import RecentErrors
from .errors import AvafsError
from .fuse import AvafsOperations
from .fuse.kernel import LIBFUSE_VERSION, PARALLEL_LOOKUPS
from .host.mounts import AVAFS_FSTYPE, device_mounted, mount_at, wait_until_unmounted
from .log_format import EscapingFormatter
from .metrics import Metrics
from .namespace import Namespace
from .namespace.known_attributes import KnownAttributes
from .reader.control_socket import SOCKET_NAME
from .snapshots.catalog import SnapshotCatalog
from .snapshots.store import SnapshotStore
from .stores import ObjectInfo, ObjectStore, StoreLimits, open_cluster_bucket, open_store
from .stores.instrumented import InstrumentedStore
from .tiers.cluster import ClusterTier
from .tiers.disk import DiskTier
from .tiers.ram import RamTier
from .tiers.request_loop import RequestLoop
from .tiers.stack import TierStack
from .warmup.runner import Prefetcher, WarmupRunner
from .writeback.cluster.coordination import Etcd
from .writeback.cluster.queue import ClusterQueue, cluster_id
from .writeback.cluster.takeover import ClusterMember
from .writeback.manager import WriteBack
from .writeback.uploader import Uploader

log = logging.getLogger("avafs")


def setup_logging(options: MountOptions, foreground: bool) -> None:
    """The log file (--log-file, by default in the cache dir) always; in the foreground stderr
    too, terminal or not: a container's or a service manager's log is the foreground daemon's
    stderr. (In the background stderr is the log file itself, so it gets no second handler.)"""
    os.close(open_log_for_append(options.log_file))  # owner-only, or a one-line error
    handler = logging.handlers.RotatingFileHandler(options.log_file, maxBytes=20 * 2**20,
                                                   backupCount=3)
    handlers: list[logging.Handler] = [handler]
    if foreground:
        handlers.append(logging.StreamHandler())
    for each in handlers:
        each.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=options.log_level.upper(), handlers=handlers, force=True)
    for noisy in ("botocore", "urllib3", "boto3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.root.level))


def lock_cache_dir(cache_dir: Path, exits: ExitStack) -> None:
    """One daemon per cache dir: two would evict each other's blocks from under them."""
    lock = exits.enter_context(open(cache_dir / LOCK_FILE, "a+"))  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = (cache_dir / PID_FILE).read_text().strip() if (cache_dir / PID_FILE).exists() else "?"
        raise AvafsError(f"cache dir {cache_dir} is in use by another avafs mount (pid {pid}): "
                         "give this mount its own --cache-dir") from None


class Filesystem:
    """The data path of one mount, top to bottom (docs/ARCHITECTURE.md, "Layers"), and the
    control socket that answers for it (its operations: `avafs/control/operations.py`)."""

    def __init__(self, options: MountOptions, mountpoint: Path) -> None:
        self.options = options
        self.mountpoint = mountpoint
        self.pid = os.getpid()
        self.started_at = time.time()
        self.warnings: list[str] = []
        """What the mount command should say besides the log: the mount works, but not as
        asked (`serve` reports them before "ready")."""
        self.recent_errors = RecentErrors()
        logging.getLogger().addHandler(self.recent_errors)
        self.metrics = Metrics(options.mount_name or str(mountpoint),
                               ",".join(sorted(options.sources.values())))
        self._other_origins: dict[str, ObjectStore] = {}
        self.origins: dict[str, ObjectStore] = {
            name: InstrumentedStore(open_store(url, options.endpoint_url, options.region,
                                               limits=StoreLimits(options.store_timeout,
                                                                  options.store_min_rate)),
                                    self.metrics)
            for name, url in options.sources.items()
        }
        """Each source's store as it is now: snapshots are made and found there."""
        for store in self.origins.values():
            store.check()
        self.snapshot: SnapshotStore | None = None
        self.stores = dict(self.origins)
        """What the mount serves of each source: the origin, or `--snapshot`'s record of it."""
        if options.snapshot:
            origin = self.origins[""]
            self.snapshot = SnapshotStore(origin,
                                          SnapshotCatalog(origin).load(options.snapshot))
            self.stores[""] = self.snapshot
            log.info("serving snapshot %r of %s: %d files", options.snapshot, origin.url,
                     self.snapshot.snapshot.summary.files)
        disk = DiskTier(options.cache_dir / DISK_TIER_DIR, options.disk_cache, options.disk_cache_files,
                        options.high_watermark, options.low_watermark, options.cache_policy,
                        KEEP_LOCATIONS_FOR)
        ram = RamTier(options.ram_cache, options.ram_cache_files, options.high_watermark,
                      options.low_watermark, options.cache_policy, disk.__contains__,
                      KEEP_LOCATIONS_FOR)
        self.stack = TierStack(ram, disk, options.block_size, options.inflight_memory,
                               self.metrics, options.read_ahead, self._cluster_tier())
        self.writeback: WriteBack | None = None
        self.uploader: Uploader | None = None
        if not options.read_only:
            self.writeback = WriteBack(options.cache_dir / WRITEBACK_DIR, self.stack.read,
                                       disk, self.metrics,
                                       int(options.disk_cache * options.dirty_high_watermark),
                                       options.writeback == "sync", options.writeback_delay)
        self.known_attributes = None if options.listing_attrs else \
            KnownAttributes(options.cache_dir / ATTRIBUTES_DIR)
        self.namespace = Namespace(self.stores, options.effective_metadata_ttl, self.writeback,
                                   options.store_timeout, known=self.known_attributes)
        self.in_place = InPlaceWatch(options.cache_dir)
        self.locations = LocationSnapshot(options.cache_dir / LOCATIONS_FILE)
        self.namespace.on_changed = self.in_place.changed
        if self.writeback is not None:
            self.writeback.on_settled = self.namespace.settled
            self.writeback.on_changed = self.in_place.changed
            self.writeback.keep_cached = self._keep_written
            self.uploader = Uploader(self.writeback, self.stores, options.upload_concurrency)
        self._warn(disk_cache_warning(options.cache_dir, options.disk_cache,
                                      disk.used + self.dirty_status()["bytes"]))
        self.cluster_member: ClusterMember | None = None
        if self.writeback is not None and options.writeback == "cluster":
            self.cluster_member = self._join_cluster(self.writeback)
        self.warmups = WarmupRunner(self.namespace, self.stack, self.metrics)
        self.prefetcher = Prefetcher(self.namespace, self.stack)
        self._watch_gauges()
        control_socket = options.cache_dir / SOCKET_NAME
        self.operations = AvafsOperations(self.namespace, self.stack, options,
                                          {"pid": str(self.pid),
                                           "cache_dir": str(options.cache_dir),
                                           "control": str(control_socket)})
        self.control = ControlServer(control_socket, ControlOperations(self).handlers)
        if options.metrics_addr:
            host, port = options.metrics_addr
            prometheus_client.start_http_server(port, host, registry=self.metrics.exported)

    def _keep_written(self, source: str, info: ObjectInfo, path: Path) -> bool:
        """A written file the store now has, offered as the cache's copy of that version."""
        return self.stack.keep_written(self.namespace.object_ref(source, info), path)

    def _cluster_tier(self) -> ClusterTier | None:
        """The shared tier of `--cluster-cache`; a store that does not answer at mount time
        is a warning, not a failed mount: it is a cache, and reads go to the source until
        it answers."""
        options = self.options
        if not options.cluster_cache:
            return None
        bucket = open_cluster_bucket(options.cluster_cache, options.cluster_endpoint_url,
                                     options.cluster_profile, options.cluster_timeout)
        try:
            bucket.check()
        except AvafsError as error:
            self._warn(f"the cluster tier {bucket.url} does not answer ({error}); reads go to "
                       "the source until it does")
        return ClusterTier(bucket, options.block_size, self.metrics)

    def _warn(self, warning: str | None) -> None:
        if warning:
            log.warning("%s", warning)
            self.warnings.append(warning)

    def _join_cluster(self, writeback: WriteBack) -> ClusterMember:
        """`--writeback cluster`: stage committed files in the cluster store, keep this node's
        queue in etcd, take over the queues of lost nodes (writeback/cluster/takeover.py)."""
        options = self.options
        bucket = open_cluster_bucket(options.cluster_cache, options.cluster_endpoint_url,
                                     options.cluster_profile, options.cluster_timeout)
        etcd = Etcd(options.etcd, timeout=min(float(options.cluster_lease_ttl) / 2, 5.0))
        queue = ClusterQueue(bucket, etcd, cluster_id(options.cluster_cache), options.node_name)
        writeback.enable_cluster(queue, dict(options.sources), options.cluster_staging_limit)
        member = ClusterMember(queue, options.cluster_lease_ttl, writeback, self.origin,
                               self.metrics)
        member.start(join_timeout=2.0 * options.cluster_lease_ttl + 5.0)
        return member

    def origin(self, url: str) -> ObjectStore:
        """The store of a source URL a cluster queue's record names: this mount's own, or one
        opened with this mount's endpoint and region."""
        for name, source in self.options.sources.items():
            if source == url:
                return self.origins[name]
        if url not in self._other_origins:
            self._other_origins[url] = open_store(url, self.options.endpoint_url,
                                                  self.options.region)
        return self._other_origins[url]

    def cluster_writes_status(self) -> dict[str, Any] | None:
        return None if self.cluster_member is None else self.cluster_member.status()

    def _watch_gauges(self) -> None:
        metrics = self.metrics
        for tier in (self.stack.ram, self.stack.disk):
            metrics.tier_used.labels(tier.name).set_function(lambda tier=tier: tier.used)
            metrics.tier_files.labels(tier.name).set_function(lambda tier=tier: len(tier))
            metrics.tier_capacity.labels(tier.name).set(tier.capacity)
        metrics.warmups_running.set_function(
            lambda: sum(job.finished_at is None for job in self.warmups.running()))
        metrics.prefetch_pending.set_function(lambda: self.prefetcher.pending)

    def dirty_status(self) -> dict[str, Any]:
        if self.writeback is None:
            return {"bytes": 0, "files": 0, "upload_queue": 0, "uploading": 0, "set_aside": []}
        return self.writeback.status()

    def close(self) -> None:
        """Stop uploading (what is pending stays journaled for the next mount) and close."""
        self.operations.close()
        self.in_place.close()
        self.control.close()
        self.locations.close()
        if self.cluster_member is not None:
            self.cluster_member.stop()
        if self.uploader is not None:
            self.uploader.stop()
        if self.writeback is not None:
            self.writeback.close_cluster()
            self.writeback.close()
        self.stack.close()
        if self.known_attributes is not None:
            self.known_attributes.close()

    async def close_on_loop(self) -> None:
        """Close what the stores opened on the request loop (`get_range_async`), on it."""
        for store in [*self.origins.values(), *self._other_origins.values()]:
            await store.close_on_loop()


def serve(options: MountOptions, mountpoint: Path, ready_fd: int | None) -> int:
    """Run a mount to completion; reports readiness or the failure on `ready_fd`.

    Everything the daemon creates (blocks, data files, journal, log) is owner-only whatever
    umask it was started with: the cache dir's contents are the mount owner's alone.
    """
    os.umask(PRIVATE_UMASK)
    try:
        created = prepare_cache_dir(options.cache_dir)
    except AvafsError as error:
        _report(ready_fd, f"error: {error}")
        return 1
    try:
        setup_logging(options, foreground=ready_fd is None)
    except AvafsError as error:
        _report(ready_fd, f"error: {error}")
        if created:
            remove_unused(options.cache_dir)
        return 1
    with ExitStack() as exits:
        try:
            lock_cache_dir(options.cache_dir, exits)
            import pyfuse3
            import pyfuse3.asyncio

            pyfuse3.asyncio.enable()  # requests are served on an asyncio loop (uvloop's)
            filesystem = Filesystem(options, mountpoint)
            exits.callback(filesystem.close)
            fuse_options = set(pyfuse3.default_options) | {"fsname=avafs", "subtype=avafs"}
            if options.allow_other:
                fuse_options.add("allow_other")
            if options.read_only:
                fuse_options.add("ro")
            if options.noexec:
                fuse_options.add("noexec")
            pyfuse3.init(filesystem.operations, str(mountpoint), fuse_options)
            for warning in filesystem.warnings:
                _report(ready_fd, f"warning: {warning}", last=False)
        except AvafsError as error:
            log.error("%s", error)
            _report(ready_fd, f"error: {error}")
            if created:  # in the foreground: the message says it all, the log is not needed
                exits.callback(remove_unused, options.cache_dir)
            return 1
        except Exception as error:
            log.exception("mount failed")
            _report(ready_fd, f"error: mount failed: {error} (see {options.log_file})")
            return 1
        (options.cache_dir / PID_FILE).write_text(f"{os.getpid()}\n")
        log.info("mounted %s at %s (pid %d, libfuse %s, %s)",
                 ", ".join(options.sources.values()), mountpoint, os.getpid(),
                 f"{LIBFUSE_VERSION // 100}.{LIBFUSE_VERSION % 100}" if LIBFUSE_VERSION
                 else "unknown",
                 "lookups in one directory side by side" if PARALLEL_LOOKUPS else
                 "lookups in one directory one at a time: scripts/build_pyfuse3.sh builds a "
                 "pyfuse3 that allows more")
        entry = mount_at(mountpoint)
        device = entry.device if entry is not None and entry.fstype == AVAFS_FSTYPE else None
        spare_the_cycle_collector()
        signalled = uvloop.run(_serve_until_done(ready_fd, mountpoint, options.block_size,
                                                 device, filesystem.stack.request_loop,
                                                 filesystem.close_on_loop))
        # A signal after the mount left this namespace must not unmount whatever is at the
        # path by now (libfuse would detach it lazily, by name).
        pyfuse3.close(unmount=signalled and (device is None or device_mounted(device)))
        log.info("unmounted %s", mountpoint)
    return 0


def spare_the_cycle_collector() -> None:
    """Keep Python's cycle collector from walking, between requests, what the set-up left.

    Serving requests makes and drops container objects (futures, tuples, coroutine frames) by
    the hundred per request, so young collections run all the time, and each tenth of them
    walks the next generation, where the set-up left about a hundred thousand objects that
    live as long as the daemon (the store clients' service models, the configuration,
    imported modules). Those are frozen (`gc.freeze`: never walked again, still freed by
    reference counting); what requests make is collected as before."""
    gc.collect()
    gc.freeze()


def widen_kernel_read_ahead(mountpoint: Path, size: int) -> None:
    """Let the kernel read ahead a whole block through the mount, best effort.

    A FUSE mount's read-ahead is 128 KiB, so a sequential reader arrives as 128 KiB READ
    requests, each a round trip through Python; with a block's worth of read-ahead the kernel
    sends libfuse's largest READs (1 MiB) and keeps several in flight: fewer round trips for
    the same bytes (`bench/probes.py read-size` measures it). Only after the FUSE INIT
    exchange: its reply caps the knob at what the kernel offered in the request (128 KiB).
    Writing the knob needs root; elsewhere the kernel's default stays."""
    entry = mount_at(mountpoint)
    if entry is None or entry.fstype != AVAFS_FSTYPE:
        return
    knob = Path("/sys/class/bdi", entry.device, "read_ahead_kb")
    try:
        knob.write_text(str(max(size // 1024, 128)))
    except OSError as error:
        log.info("kernel read-ahead left at its default (%s: %s)", knob, error.strerror)


async def _serve_until_done(ready_fd: int | None, mountpoint: Path, block_size: int,
                            device: str | None, request_loop: RequestLoop,
                            before_loop_ends: Callable[[], Awaitable[None]]) -> bool:
    """Serve requests, lending the loop to `request_loop` meanwhile, then await
    `before_loop_ends`; True if a signal ended the mount (so it may still be mounted).

    Ready is reported once the mount has answered a request of our own, so the INIT exchange
    is over and the mount command returns a mount that works.

    The session also ends once no mount of `device` (this mount and its bind mounts) is left
    in the daemon's mount namespace. The kernel ends it only when the last copy of the mount
    goes, and a mount namespace made while it was mounted (`unshare --mount`, a service with
    a private /tmp) keeps a copy for as long as it lives: `avafs umount` would wait for that
    namespace, and the daemon, still holding the cache dir's lock, would keep a remount out.
    Such copies lose the mount (ENOTCONN) instead."""
    import pyfuse3

    loop = asyncio.get_running_loop()
    signalled = False
    stop_signals = (signal.SIGTERM, signal.SIGINT)

    def stop_on_signal(signum: int) -> None:
        """The first SIGTERM or SIGINT ends the session; the signals' own handlers are back
        from then on, so a second one stops a daemon that does not unmount."""
        nonlocal signalled
        for each in stop_signals:
            loop.remove_signal_handler(each)
        log.info("received %s, unmounting", signal.Signals(signum).name)
        signalled = True
        pyfuse3.terminate()

    def report_ready_once_answering() -> None:
        try:
            os.statvfs(mountpoint)
        except OSError as error:
            log.warning("the new mount did not answer statfs (%s); serving anyway", error)
        else:
            widen_kernel_read_ahead(mountpoint, block_size)
        _report(ready_fd, "ready")

    def stop_once_unmounted_here(device: str) -> None:
        wait_until_unmounted(device)
        log.info("%s is no longer mounted in this mount namespace; ending the session",
                 mountpoint)
        with suppress(RuntimeError):  # the loop has ended already
            loop.call_soon_threadsafe(pyfuse3.terminate)

    for signum in stop_signals:
        loop.add_signal_handler(signum, stop_on_signal, signum)
    # Daemon threads, not the loop's executor: each may wait on this very loop (the statfs
    # for its answer) or for as long as the session lasts, and the loop's end would wait for
    # an executor's threads.
    threading.Thread(target=report_ready_once_answering, daemon=True,
                     name="avafs-ready").start()
    if device is not None:
        threading.Thread(target=stop_once_unmounted_here, args=(device,), daemon=True,
                         name="avafs-mount-watch").start()
    request_loop.serving(loop)
    try:
        await pyfuse3.main()
    finally:
        request_loop.ended()
        await before_loop_ends()
    return signalled


def _report(ready_fd: int | None, message: str, last: bool = True) -> None:
    """One line to the mount command: "warning: ..." lines (not `last`), then "ready" or
    "error: ...". In the foreground there is no command to tell: errors go to stderr, and
    warnings are there already, in the log."""
    if ready_fd is None:
        if message != "ready" and last:
            print(f"avafs: {message}", file=sys.stderr)
        return
    try:
        os.write(ready_fd, message.encode() + b"\n")
        if last:
            os.close(ready_fd)
    except OSError:
        log.warning("the mount command went away before the mount was ready")
