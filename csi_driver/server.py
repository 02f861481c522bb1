"""The plugin process: a gRPC server on a Unix socket plus, on a node, the repair loop.

`--mode` picks the services: `node` (the DaemonSet), `controller` (the provisioner's
Deployment, which mounts nothing and keeps no state) or `all` (both, for a one-node cluster
and for csi-sanity).

The socket is served at once, before any repair: kubelet and the sidecars see a live plugin
(Probe answers, ready=false) while dead mounts are being rebuilt, instead of restarting a
container that does not answer yet. RPCs for a volume under repair wait on its lock.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpu_sched.kube import KubeError
from gpu_sched.locality import CachePublisher

from .cache_summary import cached_bytes_by_source
from .controller import ControllerService
from .identity import IdentityService
from .node import NodeService
from .proto import csi_pb2_grpc
from .state import StateDir
from .volumes import VolumeManager

log = logging.getLogger(__name__)

MODES = ("node", "controller", "all")
WORKERS = 16
"""Concurrent RPCs: one per volume being staged at once is plenty on a training node."""


@dataclass(frozen=True)
class DriverConfig:
    socket_path: Path
    node_id: str
    driver_name: str
    state_dir: Path
    cache_root: Path
    max_volumes_per_node: int
    repair_interval: float
    allow_file_sources: bool
    mode: str = "node"
    annotate_node: Callable[[dict[str, str]], None] | None = None
    """Patches this node's annotations; set with --publish-cache-interval."""
    publish_cache_interval: float = 0.0


def _repair_loop(volumes: VolumeManager, ready: threading.Event, stop: threading.Event,
                 interval: float) -> None:
    """Reconcile once (then report ready), and again every `interval` seconds.

    The periodic pass catches a daemon that dies while the driver lives (OOM kill, crash);
    without it those pods would stay broken until the next driver restart.
    """
    while True:
        try:
            volumes.repair_all()
        except Exception:
            log.exception("repair pass failed")
        if not ready.is_set():
            ready.set()
            log.info("reconciliation done: ready")
        if interval <= 0 or stop.wait(interval):
            return


def serve(config: DriverConfig) -> None:
    ready, stop = threading.Event(), threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="rpc"))
    csi_pb2_grpc.add_IdentityServicer_to_server(
        IdentityService(config.driver_name, ready, config.mode != "node"), server)
    if config.mode != "node":
        csi_pb2_grpc.add_ControllerServicer_to_server(
            ControllerService(config.allow_file_sources), server)
    volumes = None
    if config.mode != "controller":
        volumes = VolumeManager(StateDir(config.state_dir), config.cache_root)
        csi_pb2_grpc.add_NodeServicer_to_server(
            NodeService(volumes, config.node_id, config.max_volumes_per_node,
                        config.allow_file_sources), server)
    config.socket_path.parent.mkdir(parents=True, exist_ok=True)
    config.socket_path.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{config.socket_path}")
    server.start()
    os.chmod(config.socket_path, 0o600)
    log.info("%s serving CSI (%s) on unix://%s for node %s", config.driver_name, config.mode,
             config.socket_path, config.node_id or "-")

    def shut_down(signum: int, _frame) -> None:
        log.info("received %s: stopping; avafs daemons keep serving",
                 signal.Signals(signum).name)
        stop.set()
        server.stop(grace=5)

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    if volumes is None:
        ready.set()
    else:
        threading.Thread(target=_repair_loop, name="repair", daemon=True,
                         args=(volumes, ready, stop, config.repair_interval)).start()
    if volumes is not None and config.annotate_node is not None and config.publish_cache_interval > 0:
        publisher = CachePublisher(lambda: cached_bytes_by_source(StateDir(config.state_dir)),
                                   config.annotate_node, config.publish_cache_interval)
        threading.Thread(target=publisher.run, name="cache-summary", daemon=True,
                         args=(stop, (KubeError, OSError))).start()
    server.wait_for_termination()
    stop.set()
