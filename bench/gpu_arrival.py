"""gpu_sched's policies in the arrival experiment on the Alibaba 2023 GPU trace, next to the paper.

    python3 -m bench.gpu_arrival --trace DIR [--mode simulator|deployed] [--seeds 10] [--jobs 2]
        [--workloads default,...] [--first-seed 42] [--policies fgd,binpack,spread,random]
        [--paper-csv FILE] [--out results.jsonl]
    python3 -m bench.gpu_arrival --table results.jsonl [more.jsonl ...] [--paper-csv ...]

DIR holds the trace's CSV files (`openb_node_list_gpu_node.csv`, `openb_pod_list_*.csv`); the
trace is not part of this repository. Every workload runs once per policy and seed (seeds 42,
43, ..., or from `--first-seed`) at 130% demand, in `--jobs` processes. Prints a Markdown
table: per workload, the mean share of GPUs allocated at 100% and 130% arrival for each policy
(with the 95% interval over seeds at 130%), and with `--paper-csv` (the
`experiments/analysis/expected_results/analysis_allo_discrete.csv` of the paper's simulator) the
published means at 130% beside them, with fgd's margin over the published FGD and random's over
the published Random (how far the experiment itself is from the paper's). `--mode deployed`
places every pod through gpu_sched.deployed's emulation of kube-scheduler in front of the
extender instead of the policy alone. `--table` prints the table from saved runs instead, of
either mode or both (a run listed twice counts once). With `--out`, runs already saved there are
not run again, so running the same command again resumes an interrupted measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from math import sqrt
from pathlib import Path
from typing import Any

from scipy.stats import t

from gpu_sched.arrival import ARRIVAL_POLICIES, run_arrival
from gpu_sched.deployed import DEPLOYED_POLICIES, run_deployed
from gpu_sched.trace import TraceNode, TracePod, read_nodes, read_pods

WORKLOADS = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60",
             "gpushare80", "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
             "multigpu20", "multigpu30", "multigpu40", "multigpu50")
PAPER_POLICIES = ("06-FGD", "05-BestFit", "04-GpuPacking", "03-GpuClustering", "02-DotProd",
                  "01-Random")
FIRST_SEED = 42


@cache
def _trace(directory: str, workload: str) -> tuple[list[TraceNode], list[TracePod]]:
    base = Path(directory)
    return (read_nodes(base / "openb_node_list_gpu_node.csv"),
            read_pods(base / f"openb_pod_list_{workload}.csv"))


def _one(job: tuple[str, str, str, str, int]) -> dict[str, Any]:
    directory, mode, workload, policy, seed = job
    nodes, pods = _trace(directory, workload)
    started = time.process_time()
    run = run_deployed if mode == "deployed" else run_arrival
    report = run(nodes, pods, policy, 1.3, seed)
    return {"mode": mode, "workload": workload, "policy": policy, "seed": seed,
            "cpu_seconds": time.process_time() - started,
            **{key: report[key] for key in ("allocation_at_100", "allocation_at_demand",
                                            "unallocated_gpus", "fragmented_gpus", "failed")}}


def paper_means(path: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(workload, policy) -> mean allocation (%) at 100% and 130% arrival over the paper's seeds."""
    values: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            workload = row["workload"].removeprefix("openb_pod_list_")
            values[(workload, row["sc_policy"])].append((float(row["100"]), float(row["130"])))
    return {key: (statistics.mean(v[0] for v in rows), statistics.mean(v[1] for v in rows))
            for key, rows in values.items()}


def _label(mode: str, policy: str) -> str:
    return policy if mode == "simulator" else f"{mode} {policy}"


def interval(values: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean (Student's t); 0 for one value."""
    if len(values) < 2:
        return 0.0
    return float(t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / sqrt(len(values)))


def _cell(values: list[float | None], with_interval: bool) -> str:
    known = [100 * v for v in values if v is not None]
    if not known:
        return "-"
    text = f"{statistics.mean(known):.2f}"
    return text + (f" ± {interval(known):.2f}" if with_interval and len(known) > 1 else "")


def table(results: list[dict[str, Any]], policies: list[str], workloads: list[str],
          paper: dict[tuple[str, str], tuple[float, float]] | None) -> str:
    """Per workload and (mode, policy) run: mean allocation at 100% / 130% demand (with the 95%
    interval at 130% over seeds), the paper's means, and each fgd's and random's margin over the
    paper's FGD and Random."""
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        runs[(result.get("mode", "simulator"), result["workload"], result["policy"])].append(result)
    columns = sorted({(mode, policy) for mode, _, policy in runs if policy in policies},
                     key=lambda c: (c[0] != "simulator", c[0], policies.index(c[1])))
    seeds = {c: min(len(runs[(c[0], w, c[1])]) for w in workloads) for c in columns}
    header = ["workload"] + [f"{_label(*c)} 100% / 130% ({seeds[c]} seeds)" for c in columns]
    margins = [(c, paper_name) for c in columns
               for policy, paper_name in (("fgd", "06-FGD"), ("random", "01-Random"))
               if c[1] == policy] if paper else []
    if paper:
        header += [f"paper {p.split('-')[1]} 130%" for p in PAPER_POLICIES]
        header += [f"{_label(*c)} - paper {name.split('-')[1]} (130%)" for c, name in margins]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload in workloads:
        cells = [workload]
        for mode, policy in columns:
            found = runs[(mode, workload, policy)]
            cells.append(_cell([r["allocation_at_100"] for r in found], False) + " / "
                         + _cell([r["allocation_at_demand"] for r in found], True))
        if paper:
            cells += [f"{paper[(workload, p)][1]:.2f}" for p in PAPER_POLICIES]
            for (mode, policy), name in margins:
                found = runs[(mode, workload, policy)]
                ours = statistics.mean(100 * r["allocation_at_demand"] for r in found)
                cells.append(f"{ours - paper[(workload, name)][1]:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_runs(paths: list[Path]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """Saved runs (--out files) by mode, workload, policy and seed; the last of duplicates."""
    runs = {}
    for path in paths:
        for line in path.read_text().splitlines():
            run = json.loads(line)
            runs[(run.get("mode", "simulator"), run["workload"], run["policy"], run["seed"])] = run
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", help="directory of the trace's CSV files")
    parser.add_argument("--table", type=Path, nargs="+", help="only print the table of these "
                        "saved runs (--out files)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--mode", choices=("simulator", "deployed"), default="simulator",
                        help="deployed: every pod through the kube-scheduler emulation")
    parser.add_argument("--policies", help="default: fgd,binpack,spread,random "
                        "(deployed: also fgd-warm)")
    parser.add_argument("--paper-csv", type=Path, help="the paper's analysis_allo_discrete.csv")
    parser.add_argument("--out", type=Path,
                        help="append every run's figures to this file, one JSON line each")
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    every = DEPLOYED_POLICIES if args.mode == "deployed" or args.table else ARRIVAL_POLICIES
    policies = (args.policies or ",".join(every)).split(",")
    paper = paper_means(args.paper_csv) if args.paper_csv else None
    if args.table:
        print(table(list(load_runs(args.table).values()), policies, workloads, paper))
        return 0
    if not args.trace:
        parser.error("give --trace DIR to run, or --table FILE to print saved runs")
    missing = [w for w in workloads
               if not (Path(args.trace) / f"openb_pod_list_{w}.csv").is_file()]
    if missing or not (Path(args.trace) / "openb_node_list_gpu_node.csv").is_file():
        print(f"gpu_arrival: {args.trace} lacks the node list or pod list(s) {missing}",
              file=sys.stderr)
        return 1
    # Seed by seed, so an interrupted run still covers every workload and policy; runs already
    # in --out are not run again, so a second invocation resumes an interrupted one.
    saved = load_runs([args.out]) if args.out and args.out.is_file() else {}
    jobs = [(args.trace, args.mode, w, p, args.first_seed + s) for s in range(args.seeds)
            for w in workloads for p in policies]
    results = [saved[job[1:]] for job in jobs if job[1:] in saved]
    jobs = [job for job in jobs if job[1:] not in saved]
    started = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        for result in pool.map(_one, jobs):
            results.append(result)
            if args.out:
                with args.out.open("a") as handle:
                    handle.write(json.dumps(result) + "\n")
    elapsed = time.monotonic() - started
    cpu = sum(r["cpu_seconds"] for r in results)
    by_policy = {p: sum(r["cpu_seconds"] for r in results if r["policy"] == p) for p in policies}
    print(f"{len(jobs)} runs in {elapsed:.0f} s wall; {len(results)} runs took {cpu:.0f} s CPU "
          f"({', '.join(f'{p} {s:.0f} s' for p, s in by_policy.items())})\n")
    print(table(results, policies, workloads, paper))
    return 0


if __name__ == "__main__":
    sys.exit(main())
