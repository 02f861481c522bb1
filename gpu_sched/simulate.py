"""Replays a GPU cluster trace through the extender's placement code to compare policies.

Run:
  python -m gpu_sched.simulate --nodes NODES.csv --pods PODS.csv --policy binpack [--json]
  python -m gpu_sched.simulate --nodes NODES.csv --pods PODS.csv --policy all [--plot FILE.png]
  python -m gpu_sched.simulate --mode arrival --nodes NODES.csv --pods PODS.csv --policy all \
      --demand 1.3 --seeds 10 [--json] [--plot FILE.png]
  python -m gpu_sched.simulate generate --nodes 40 --pods 3000 --seed 1 --out DIR

--mode arrival runs the experiment of gpu_sched/arrival.py (pods arrive until they ask for
--demand times the GPU capacity, never leave); the default, --mode time, replays the trace's
creation and deletion times, described below.

Pods arrive at creation_time and leave at deletion_time (departures first when both fall on the same
second). A pod that fits nowhere when it arrives fails; it does not wait, so every policy faces the
same arrivals. A pod goes only to a node with the CPU and memory it asks for left, as kube-scheduler
checks those before the extender sees a pod; CPU-only pods are placed too (by the policy, as the
extender places them), as they take CPU and memory from GPU machines. The nodes carry their CPU and memory
left and the requests the pods' CPU and memory asks, so fgd weighs them as the extender's does.
Trace machines get an assumed 2-socket PCIe wiring (the trace does not record it).
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest, NodeGpus, Placement
from gpu_sched.arrival import ARRIVAL_POLICIES, run_arrival
from gpu_sched.placement import feasible_nodes
from gpu_sched.policies import POLICY_NAMES, make_policy
from gpu_sched.topology import Topology, dual_socket_pcie, link_name
from gpu_sched.trace import (
    TraceError,
    TraceNode,
    TracePod,
    generate,
    read_nodes,
    read_pods,
    write_nodes,
    write_pods,
)


class _Cluster:
    """Node GPU state plus a histogram of free whole GPUs per node, kept current at every change.

    The histogram makes the fragmentation metric O(GPUs per node) per event instead of O(nodes).
    """

    def __init__(self, trace_nodes: list[TraceNode]) -> None:
        topologies: dict[int, Topology] = {}
        self.nodes = [NodeGpus(n.sn, topologies.setdefault(n.gpu, dual_socket_pcie(n.gpu)), n.model,
                               n.cpu_milli, n.memory_mib)
                      for n in sorted(trace_nodes, key=lambda n: n.sn) if n.gpu > 0]
        self.total_milli = sum(node.capacity for node in self.nodes) * MILLI_PER_GPU
        self.used_milli = 0
        self.free_histogram = Counter(node.capacity for node in self.nodes)

    def hosts(self, node: NodeGpus, pod: TracePod) -> bool:
        """Whether the node has the CPU and memory the pod asks for left."""
        return node.cpu_left >= pod.cpu_milli and node.memory_left >= pod.memory_mib

    def _change(self, node: NodeGpus, placement: Placement, pod: TracePod, apply: bool) -> None:
        before = node.free_count()
        sign = 1 if apply else -1
        if apply:
            node.apply(placement)
        else:
            node.release(placement)
        self.used_milli += sign * placement.milli_each * len(placement.gpus)
        node.cpu_left -= sign * pod.cpu_milli
        node.memory_left -= sign * pod.memory_mib
        self.free_histogram[before] -= 1
        self.free_histogram[node.free_count()] += 1

    def place(self, node: NodeGpus, placement: Placement, pod: TracePod) -> None:
        self._change(node, placement, pod, True)

    def remove(self, node: NodeGpus, placement: Placement, pod: TracePod) -> None:
        self._change(node, placement, pod, False)

    def fragmentation(self, next_multi_gpu: int | None) -> float | None:
        """Share of free GPUs sitting on nodes with too few free GPUs for the next multi-GPU job."""
        free = sum(count * n for count, n in self.free_histogram.items())
        if next_multi_gpu is None or not free:
            return None
        stranded = sum(count * n for count, n in self.free_histogram.items()
                       if count < next_multi_gpu)
        return stranded / free


def _largest_machine(nodes: list[NodeGpus], request: GpuRequest) -> int:
    return max((node.capacity for node in nodes if request.accepts_model(node.model)), default=0)


def _time_weighted_mean(samples: list[tuple[int, float | None]]) -> float | None:
    """Mean of a step function given as (time, value) changes; None values are gaps, not zeros."""
    area = span = 0.0
    for (time, value), (next_time, _) in zip(samples, samples[1:], strict=False):
        if value is not None:
            area += value * (next_time - time)
            span += next_time - time
    if span:
        return area / span
    values = [value for _, value in samples if value is not None]
    return sum(values) / len(values) if values else None


def simulate(trace_nodes: list[TraceNode], trace_pods: list[TracePod], policy_name: str,
             seed: int = 0) -> dict[str, Any]:
    if any(pod.creation_time is None for pod in trace_pods):
        raise TraceError("the pods have no creation_time: replay them with --mode arrival")
    policy = make_policy(policy_name, seed)
    cluster = _Cluster(trace_nodes)
    order = sorted(range(len(trace_pods)), key=lambda i: (trace_pods[i].creation_time, i))
    requests = [trace_pods[i].request() for i in order]
    next_multi: list[int | None] = [None] * (len(order) + 1)
    for position in range(len(order) - 1, -1, -1):
        gpus = requests[position].gpus
        next_multi[position] = gpus if gpus >= 2 else next_multi[position + 1]
    largest_for: dict[frozenset[str], int] = {}

    utilization: list[tuple[int, float | None]] = []
    fragmentation: list[tuple[int, float | None]] = []

    def sample(time: int, pending_from: int) -> None:
        utilization.append((time, cluster.used_milli / cluster.total_milli
                            if cluster.total_milli else 0.0))
        fragmentation.append((time, cluster.fragmentation(next_multi[pending_from])))

    departures: list[tuple[int, int, NodeGpus, Placement, TracePod]] = []
    gpu_pods = placed = whole_requests = whole_placed = cpu_only_placed = 0
    bottlenecks: list[int] = []
    for position, index in enumerate(order):
        pod = trace_pods[index]
        while departures and departures[0][0] <= pod.creation_time:
            left_at, _, node, placement, gone = heapq.heappop(departures)
            cluster.remove(node, placement, gone)
            sample(left_at, position)
        request = requests[position]
        policy.learn(pod.name, request)
        hosts = [node for node in cluster.nodes if cluster.hosts(node, pod)]
        if request.wants_gpu:
            gpu_pods += 1
            if request.models not in largest_for:
                largest_for[request.models] = _largest_machine(cluster.nodes, request)
            is_whole_node = request.gpus >= 2 and request.gpus == largest_for[request.models]
            whole_requests += is_whole_node
            choice = policy.choose(request, feasible_nodes(request, hosts)[0])
        else:
            choice = policy.choose(request, hosts)
        if choice is not None:
            node, placement = choice
            cluster.place(node, placement, pod)
            if request.wants_gpu:
                placed += 1
                whole_placed += is_whole_node
            else:
                cpu_only_placed += 1
            if placement.bottleneck is not None:
                bottlenecks.append(placement.bottleneck)
            if pod.deletion_time is not None:
                heapq.heappush(departures, (pod.deletion_time, position, node, placement, pod))
        sample(pod.creation_time, position + 1)
    while departures:
        left_at, _, node, placement, gone = heapq.heappop(departures)
        cluster.remove(node, placement, gone)
        sample(left_at, len(order))

    mean_bottleneck = sum(bottlenecks) / len(bottlenecks) if bottlenecks else None
    series: dict[int, float] = {}
    for time, value in utilization:
        series[time] = round(value or 0.0, 4)
    return {
        "policy": policy_name,
        "seed": seed,
        "nodes": len(cluster.nodes),
        "gpus": cluster.total_milli // MILLI_PER_GPU,
        "pods": len(trace_pods),
        "gpu_pods": gpu_pods,
        "placed": placed,
        "failed": gpu_pods - placed,
        "cpu_only_pods": len(trace_pods) - gpu_pods,
        "cpu_only_placed": cpu_only_placed,
        "whole_node_requests": whole_requests,
        "whole_node_placed": whole_placed,
        "whole_node_success_rate": whole_placed / whole_requests if whole_requests else None,
        "multi_gpu_placements": len(bottlenecks),
        "mean_free_gpu_fragmentation": _time_weighted_mean(fragmentation),
        "mean_bottleneck_link": mean_bottleneck,
        "mean_bottleneck_link_name": link_name(int(mean_bottleneck)) if mean_bottleneck else None,
        "bottleneck_links": {link_name(rank): count for rank, count
                             in sorted(Counter(bottlenecks).items(), reverse=True)},
        "mean_gpu_utilization": _time_weighted_mean(utilization),
        "peak_gpu_utilization": max((value or 0.0 for _, value in utilization), default=0.0),
        "gpu_utilization": [[time, value] for time, value in series.items()],
    }


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(reports: list[dict[str, Any]]) -> str:
    header = ("policy", "gpu pods", "placed", "failed", "whole-node ok", "fragmentation",
              "bottleneck", "mean util", "peak util")
    rows = [header]
    for r in reports:
        whole = f"{r['whole_node_placed']}/{r['whole_node_requests']}"
        if r["whole_node_success_rate"] is not None:
            whole += f" ({r['whole_node_success_rate']:.0%})"
        bottleneck = "-" if r["mean_bottleneck_link"] is None else (
            f"{r['mean_bottleneck_link']:.2f} {r['mean_bottleneck_link_name']}")
        rows.append((r["policy"], str(r["gpu_pods"]), str(r["placed"]), str(r["failed"]), whole,
                     _number(r["mean_free_gpu_fragmentation"]), bottleneck,
                     _number(r["mean_gpu_utilization"]), _number(r["peak_gpu_utilization"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    return "\n".join(lines)


def write_plot(reports: list[dict[str, Any]], path: str) -> None:
    """Utilization over time per policy, and the headline numbers side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (timeline, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    for report in reports:
        points = report["gpu_utilization"]
        timeline.step([p[0] / 3600 for p in points], [p[1] for p in points], where="post",
                      label=report["policy"])
    timeline.set(xlabel="hours since trace start", ylabel="GPUs allocated (share)",
                 title="GPU utilization")
    timeline.legend()
    metrics = (("whole_node_success_rate", "whole-node success"),
               ("mean_free_gpu_fragmentation", "free-GPU fragmentation"),
               ("mean_gpu_utilization", "mean utilization"))
    width = 0.8 / len(reports)
    for offset, report in enumerate(reports):
        values = [report[key] or 0.0 for key, _ in metrics]
        bars.bar([i + offset * width for i in range(len(metrics))], values, width,
                 label=report["policy"])
    bars.set_xticks([i + width * (len(reports) - 1) / 2 for i in range(len(metrics))],
                    [label for _, label in metrics])
    bars.set(ylim=(0, 1), title="policy comparison")
    bars.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _generate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_sched.simulate generate",
                                     description="Write a synthetic trace in the Alibaba 2023 format.")
    parser.add_argument("--nodes", type=int, required=True, help="number of machines")
    parser.add_argument("--pods", type=int, required=True, help="number of pods")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="directory for nodes.csv and pods.csv")
    args = parser.parse_args(argv)
    try:
        nodes, pods = generate(args.nodes, args.pods, args.seed)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_nodes(out / "nodes.csv", nodes)
        write_pods(out / "pods.csv", pods)
    except (TraceError, OSError) as exc:
        print(f"gpu_sched.simulate: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out / 'nodes.csv'} ({len(nodes)} nodes) and {out / 'pods.csv'} ({len(pods)} pods)")
    return 0


SUMMARY_KEYS = ("allocation_at_100", "allocation_at_demand", "unallocated_gpus",
                "fragmented_gpus", "failed", "failed_gpu_pods")


def summarize_arrival(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy, the mean over its seeds of each headline figure and of the allocation curve."""
    summaries = []
    for policy in dict.fromkeys(run["policy"] for run in runs):
        mine = [run for run in runs if run["policy"] == policy]
        summary: dict[str, Any] = {"policy": policy, "seeds": [run["seed"] for run in mine]}
        for key in SUMMARY_KEYS:
            values = [run[key] for run in mine if run[key] is not None]
            summary[key] = sum(values) / len(values) if values else None
        curves = [run["allocation_by_arrival_percent"] for run in mine]
        summary["allocation_by_arrival_percent"] = [
            sum(values) / len(values) if (values := [v for v in column if v is not None]) else None
            for column in zip(*curves, strict=True)]
        summaries.append(summary)
    return summaries


def format_arrival_table(summaries: list[dict[str, Any]], demand: float) -> str:
    header = ("policy", "seeds", "alloc@100%", f"alloc@{demand:.0%}", "unallocated GPUs",
              "fragmented GPUs", "failed pods")
    rows = [header]
    for s in summaries:
        rows.append((s["policy"], str(len(s["seeds"])),
                     "-" if s["allocation_at_100"] is None else f"{s['allocation_at_100']:.2%}",
                     f"{s['allocation_at_demand']:.2%}", f"{s['unallocated_gpus']:.1f}",
                     f"{s['fragmented_gpus']:.1f}", f"{s['failed']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     for row in rows)


def write_arrival_plot(summaries: list[dict[str, Any]], path: str, title: str) -> None:
    """Allocated GPU share against arrived GPU demand, one line per policy (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for summary in summaries:
        points = [(p, 100 * v) for p, v in enumerate(summary["allocation_by_arrival_percent"])
                  if v is not None]
        axes.plot([p for p, _ in points], [v for _, v in points],
                  label=f"{summary['policy']} ({100 * summary['allocation_at_demand']:.2f}%)")
    axes.plot([0, 100], [0, 100], color="grey", linewidth=0.5, linestyle=":")
    axes.set(xlabel="arrived GPU demand (% of capacity)", ylabel="GPUs allocated (%)",
             title=title)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["generate"]:
        return _generate_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m gpu_sched.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True, help="nodes CSV (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument("--pods", required=True, help="pods CSV (Alibaba 2023 pod list columns)")
    parser.add_argument("--mode", choices=("time", "arrival"), default="time",
                        help="replay creation/deletion times, or the arrival experiment")
    parser.add_argument("--policy", choices=(*POLICY_NAMES, "all"), default="binpack")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for the random policy; in arrival mode, the first seed")
    parser.add_argument("--seeds", type=_positive_int, default=1,
                        help="arrival mode: runs per policy, seeds --seed, --seed+1, ...")
    parser.add_argument("--demand", type=_positive_float, default=1.3,
                        help="arrival mode: GPU demand to arrive, as a multiple of capacity")
    parser.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    parser.add_argument("--plot", help="also write a PNG comparing the policies (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("gpu_sched.simulate: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    try:
        nodes, pods = read_nodes(args.nodes), read_pods(args.pods)
        if args.mode == "arrival":
            names = ARRIVAL_POLICIES if args.policy == "all" else (args.policy,)
            runs = [run_arrival(nodes, pods, name, args.demand, seed) for name in names
                    for seed in range(args.seed, args.seed + args.seeds)]
        elif any(pod.creation_time is None for pod in pods):
            raise TraceError(f"{args.pods} has no creation_time: replay it with --mode arrival")
        else:
            names = POLICY_NAMES if args.policy == "all" else (args.policy,)
            reports = [simulate(nodes, pods, name, args.seed) for name in names]
    except TraceError as exc:
        print(f"gpu_sched.simulate: {exc}", file=sys.stderr)
        return 1
    if args.mode == "arrival":
        summaries = summarize_arrival(runs)
        if args.json:
            print(json.dumps({"summary": summaries, "runs": runs}))
        else:
            print(format_arrival_table(summaries, args.demand))
        if args.plot:
            seeds = f"{args.seeds} seed{'s' if args.seeds > 1 else ''}"
            write_arrival_plot(summaries, args.plot, f"{Path(args.pods).stem}: GPU allocation "
                               f"as demand arrives ({seeds})")
    else:
        if args.json:
            print(json.dumps(reports if args.policy == "all" else reports[0]))
        else:
            print(format_table(reports))
        if args.plot:
            write_plot(reports, args.plot)
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
