"""Node agent: publishes this node's GPU links as the node annotation gpu-sched/topology.

Run: python -m gpu_sched.agent --node NAME [--topo-file FILE] [--kube-api URL] [--interval S]

Reads `nvidia-smi topo -m` (or a saved copy of its output), parses it, and patches the node through
the API server. It publishes once and exits, or with --interval keeps republishing (retrying after errors), which a
DaemonSet needs, as its pods must not exit, and which repairs the annotation if someone removes it.
--dry-run prints the annotation instead of patching, to check what a machine would publish.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from gpu_sched.k8s_objects import TOPOLOGY_ANNOTATION
from gpu_sched.kube import KubeClient, KubeError, api_client
from gpu_sched.topology import Topology, TopologyError, parse_nvidia_smi_topo


class AgentError(RuntimeError):
    """Something that stops the agent from knowing or publishing the topology."""


def read_topology(topo_file: str | None) -> Topology:
    if topo_file:
        try:
            text = Path(topo_file).read_text()
        except OSError as exc:
            raise AgentError(f"cannot read {topo_file}: {exc.strerror}") from exc
    else:
        try:
            run = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                 timeout=60, check=False)
        except FileNotFoundError as exc:
            raise AgentError("nvidia-smi is not installed here; pass --topo-file FILE") from exc
        except subprocess.TimeoutExpired as exc:
            raise AgentError("nvidia-smi topo -m did not finish in 60 s") from exc
        if run.returncode:
            message = (run.stderr or run.stdout).strip().splitlines()
            raise AgentError(f"nvidia-smi topo -m failed: {message[0] if message else run.returncode}")
        text = run.stdout
    try:
        return parse_nvidia_smi_topo(text)
    except TopologyError as exc:
        raise AgentError(f"cannot read the topology from {topo_file or 'nvidia-smi'}: {exc}") from exc


def publish(kube: KubeClient, node: str, topo_file: str | None) -> None:
    topology = read_topology(topo_file)
    kube.annotate_node(node, {TOPOLOGY_ANNOTATION: topology.to_annotation()})
    print(f"published {topology.gpu_count}-GPU topology on node {node}", file=sys.stderr, flush=True)


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_sched.agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", required=True, help="this node's name (downward API spec.nodeName)")
    parser.add_argument("--topo-file", help="saved `nvidia-smi topo -m` output instead of running it")
    parser.add_argument("--kube-api", help="API server URL; default: in-cluster, then kubeconfig")
    parser.add_argument("--interval", type=_positive,
                        help="republish every this many seconds instead of exiting")
    parser.add_argument("--dry-run", action="store_true", help="print the annotation, patch nothing")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            print(f"{TOPOLOGY_ANNOTATION}={read_topology(args.topo_file).to_annotation()}")
            return 0
        kube = KubeClient(api_client(args.kube_api))
        if args.interval is None:
            publish(kube, args.node, args.topo_file)
            return 0
    except (AgentError, KubeError) as exc:
        print(f"gpu_sched.agent: {exc}", file=sys.stderr)
        return 1
    while True:
        try:
            publish(kube, args.node, args.topo_file)
        except (AgentError, KubeError) as exc:
            print(f"gpu_sched.agent: {exc}; retrying in {args.interval:g} s", file=sys.stderr,
                  flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
