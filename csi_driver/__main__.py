"""`python -m csi_driver --endpoint unix:///csi/csi.sock [--mode node] --node-id NODE [--state-dir DIR]`."""

from __future__ import annotations

import argparse
import functools
import logging
import re
import sys
from pathlib import Path
from typing import NoReturn

from gpu_sched.kube import KubeClient, KubeError, api_client

from . import DEFAULT_DRIVER_NAME
from .server import MODES, DriverConfig, serve

DRIVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$")
CLIENT_LIBRARIES = ("botocore", "boto3", "urllib3")
"""Loggers kept at WARNING whatever --log-level says: at DEBUG, botocore logs every request's
headers, which carry the provisioner secret's key id and session token."""


class OneLineParser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr, which is what a crash-looping pod's log shows."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _unix_socket(endpoint: str) -> Path:
    match = re.fullmatch(r"unix://?(/.+)", endpoint)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected unix:///absolute/path/csi.sock, got {endpoint!r}")
    return Path(match.group(1))


def _driver_name(name: str) -> str:
    if not DRIVER_NAME.match(name):
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a domain name of at most 63 characters")
    return name


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds, 0 or more, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="avafs-csi", description="avafs CSI plugin.")
    parser.add_argument("--endpoint", required=True, type=_unix_socket,
                        help="gRPC socket, unix:///path/csi.sock")
    parser.add_argument("--mode", choices=MODES, default="node",
                        help="the CSI services to serve: node (mounts, on every node), "
                             "controller (creates and deletes volumes, beside the "
                             "external-provisioner) or all (default node)")
    parser.add_argument("--node-id", default="",
                        help="this node's name (NodeGetInfo); required in node and all modes")
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/avafs-csi"),
                        help="records of staged and published volumes, and stage secrets "
                             "(default /var/lib/avafs-csi)")
    parser.add_argument("--cache-root", type=Path,
                        help="parent of the volumes' cache dirs (default STATE_DIR/cache)")
    parser.add_argument("--driver-name", type=_driver_name, default=DEFAULT_DRIVER_NAME,
                        help=f"CSI driver name (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument("--max-volumes-per-node", type=_non_negative, default=0,
                        help="reported to the scheduler; 0 means no limit (default 0)")
    parser.add_argument("--repair-interval", type=_seconds, default=10.0,
                        help="seconds between checks for dead mounts; 0 checks only at start "
                             "(default 10)")
    parser.add_argument("--allow-file-sources", action="store_true",
                        help="accept file:// volume sources (directories of the plugin's "
                             "container); off by default, as a volume could then expose the "
                             "node's kubelet and state directories")
    parser.add_argument("--publish-cache-interval", type=_seconds, default=0.0,
                        help="every this many seconds at most, publish the bytes cached per "
                             "volume source as the node annotation avafs.io/cached-bytes, for "
                             "the GPU scheduler's data locality; needs patch on nodes; 0 (the "
                             "default) publishes nothing")
    parser.add_argument("--kube-api", help="API server URL for --publish-cache-interval; "
                        "default: in-cluster credentials")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode != "controller" and not args.node_id.strip():
        build_parser().error(f"--node-id is required and must not be empty in {args.mode} mode")
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for client_library in CLIENT_LIBRARIES:
        logging.getLogger(client_library).setLevel(max(logging.WARNING, logging.root.level))
    annotate_node = None
    if args.publish_cache_interval > 0:
        try:
            kube = KubeClient(api_client(args.kube_api))
        except KubeError as error:
            build_parser().error(f"--publish-cache-interval: {error}")
        annotate_node = functools.partial(kube.annotate_node, args.node_id)
    serve(DriverConfig(socket_path=args.endpoint, node_id=args.node_id,
                       driver_name=args.driver_name, state_dir=args.state_dir,
                       cache_root=args.cache_root or args.state_dir / "cache",
                       max_volumes_per_node=args.max_volumes_per_node,
                       repair_interval=args.repair_interval,
                       allow_file_sources=args.allow_file_sources, mode=args.mode,
                       annotate_node=annotate_node,
                       publish_cache_interval=args.publish_cache_interval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
