"""Probes behind the optimization proposals in BENCHMARKS.md, each a few seconds long.

    python3 -m bench.probes ranges      # GET throughput by range size on this server
    python3 -m bench.probes read-size   # reads through avafs with 128 KiB vs 1 MiB FUSE reads
    python3 -m bench.probes requests    # FUSE requests per small file, cold and warm (strace)
    python3 -m bench.probes reads       # avafs alone: cold, warm and remount reads, in a minute
    python3 -m bench.probes pyfuse3-ceiling   # small files/s of a pyfuse3 fs that does nothing
    python3 -m bench.probes writes      # 1 GiB written until durable: avafs vs direct upload
    python3 -m bench.probes write-profile   # the daemon's CPU by library while 1 GiB is written
    python3 -m bench.probes small-writes    # 2000 small files until durable: CPU, thread switches
    python3 -m bench.probes walk        # find/stat of 20,000 entries: avafs vs local disk
    python3 -m bench.probes first-walk  # a fresh mount's walk of 1,000 directories (listings)
    python3 -m bench.probes batch-reads # batched whole-file reads after a remount
    python3 -m bench.probes page-cache  # a cached file read through avafs vs local: folio sizes
    python3 -m bench.probes per-connection  # cold large from a store bounding each connection

They measure what a change to avafs would buy before it is made: `ranges` shows what a
larger fetch unit gives a sequential reader, `read-size` raises the mount's read-ahead
through sysfs (what avafs could do itself after mounting) and reads data held in the RAM
tier, `requests` counts the daemon's replies on /dev/fuse per file read (read-write and
`--read-only` mounts), `reads` is the read half of the benchmark for avafs alone, to try a
change to the read path quickly, and
`pyfuse3-ceiling` reads 16 KiB files, 8 at a time, from `trivial_fs.py`, which answers from
memory: the most small files a second any pyfuse3 file system can serve on this machine.
`writes` is the benchmark's large write alone: the write and the flush through avafs, and
the direct upload of the same bytes, round after round, with the CPU each phase cost the
daemon and the server; `write-profile` samples the daemon with perf during that write and
splits its CPU between the kernel, Python and the libraries (libcrypto: SigV4's SHA-256 of
each part over plain HTTP; libz: the part's CRC32). `small-writes` writes 2000 small files
through avafs until they are in the store and uploads as many directly, printing the daemon's
CPU and context switches per file next to the ratio; with `--latency S` both go through the
tests' fault proxy, which holds every answer S seconds, as a distant store's answers come.
`walk` is the benchmark's find/stat alone, with `--base` as for `reads`. `first-walk` is the listing half of the ImageNet tree's
first epoch: a walk of a fresh mount of 1,000 directories of 10 files, each a LIST, with
`--base` as for `reads` and `--list-latency S` to have every LIST answered S seconds late (the
tests' fault proxy between the mount and the store), as a distant store answers.
`batch-reads` reads 2,000 files of 110 KiB through the control socket (`Client.read_files`,
64 a batch, as AvaMapDataset's host view does) after a remount with the cache dir's pages
dropped, so from the disk tier's files on the device, with `--base` as for `reads`.
`page-cache` reads a 256 MiB file held in the page cache, through avafs and on local disk, with
1 MiB reads, and counts how the kernel holds each file's cached pages (single pages or large
folios, from /proc/self/pagemap and /proc/kpageflags, which need root): a warm read of a large
file that reaches no daemon copies from those pages, so its rate is the kernel's alone.
`per-connection` reads large files cold through the tests' fault proxy serving each connection
at `--rate` MB/s, as a cloud store bounds a connection, beside the direct 8-thread download
through it, with `--base` as for `reads`: what one sequential reader gets from its streams'
pieces side by side.
"""

from __future__ import annotations

import argparse
import collections
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

from bench.harness import s3server
from bench.harness.common import (
    MiB,
    PeakWatch,
    drop_page_cache,
    make_dataset,
    median,
    read_all,
    set_aside,
    timed,
    write_local,
)
from bench.harness.mounts import AvafsMount, cpu_seconds, unmount_everything
from bench.harness.workloads import (
    TREE_ENTRIES,
    WritePlan,
    drop_cached_pages,
    stat_tree,
    tree_names,
    write_tree,
)
from bench.servers.fault_proxy import FaultProxy

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 3
READ_PHASES = ("cold-large", "cold-small", "warm-large", "warm-small", "remount-large",
               "remount-small")
_ARGS = argparse.Namespace()
"""The command line, read once by main()."""


def probe_ranges(server: s3server.Store, workdir: Path) -> None:
    """MB/s of 4 x 64 MiB objects read in ranged GETs of 4, 16 and 64 MiB."""
    dataset = make_dataset(4, 64 * MiB, 0, 0)
    write_local(workdir / "data", dataset)
    client = server.client()
    s3server.upload_files(client, workdir / "data", dataset.large)
    for part in (4 * MiB, 16 * MiB, 64 * MiB):
        for threads in (1, 8):
            jobs = [(name, start, min(dataset.large_size, start + part) - 1)
                    for name in dataset.large for start in range(0, dataset.large_size, part)]

            def get(job: tuple[str, int, int]) -> int:
                name, start, end = job
                reply = client.get_object(Bucket=s3server.BUCKET, Key=name,
                                          Range=f"bytes={start}-{end}")
                return len(reply["Body"].read())

            def run(jobs=jobs, threads=threads) -> float:
                started = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    size = sum(pool.map(get, jobs))
                return size / (time.perf_counter() - started) / 1e6

            rates = [run() for _ in range(ROUNDS)]
            print(f"ranged GETs of {part // MiB:2d} MiB, {threads} thread(s): "
                  f"{median(rates):6.0f} MB/s  (rounds: {', '.join(f'{r:.0f}' for r in rates)})")

    def transfer() -> float:
        started = time.perf_counter()
        size = s3server.download_transfer(client, dataset.large)
        return size / (time.perf_counter() - started) / 1e6

    rates = [transfer() for _ in range(ROUNDS)]
    print(f"boto3 download_fileobj, 8 threads:  {median(rates):6.0f} MB/s  "
          f"(rounds: {', '.join(f'{r:.0f}' for r in rates)})")


def _bench_mount(server: s3server.Store, workdir: Path,
                 options: tuple[str, ...] = ()) -> AvafsMount:
    """avafs mounted with the benchmark's cache sizes, its cache under `workdir`."""
    mount = AvafsMount(server, workdir / "mnt", 2**30, 10 * 2**30, options)
    mount.mount(workdir / "cache")
    return mount


def _avafs_mount(server: s3server.Store, workdir: Path, names: list[str],
                 root: Path, options: tuple[str, ...] = ()) -> AvafsMount:
    s3server.upload_files(server.client(), root, names)
    return _bench_mount(server, workdir, options)


def _require(tool: str, package: str, probe: str) -> None:
    if shutil.which(tool) is None:
        raise SystemExit(f"the {probe} probe needs {tool}: apt-get install {package}")


_PERF_DENIED = ("attaching to the daemon needs root or a lower "
                "/proc/sys/kernel/perf_event_paranoid")


def _read_ahead_file(mountpoint: Path) -> Path:
    device = os.stat(mountpoint).st_dev
    return Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")


def probe_read_size(server: s3server.Store, workdir: Path) -> None:
    """Large files already in the RAM tier, read through the mount with the kernel's page
    cache dropped, at read-ahead 128 KiB (the FUSE default: 128 KiB READ requests) and
    larger (1 MiB READs, the most libfuse's default max_pages allows)."""
    dataset = make_dataset(4, 64 * MiB, 0, 0)
    write_local(workdir / "data", dataset)
    mount = _avafs_mount(server, workdir, dataset.large, workdir / "data")
    try:
        root = mount.mountpoint
        read_all(root, dataset.large, threads=1)
        knob = _read_ahead_file(root)
        results: dict[str, list[tuple[float, float]]] = {}
        for _ in range(ROUNDS):
            for value in ("128", "1024", "4096"):
                knob.write_text(value)
                drop_page_cache(root / name for name in dataset.large)
                before = cpu_seconds(mount.pid)
                size, seconds = read_all(root, dataset.large, threads=1)
                results.setdefault(value, []).append(
                    (size / seconds / 1e6, cpu_seconds(mount.pid) - before))
        for value, runs in results.items():
            print(f"read_ahead_kb={value:>4}: {median([r for r, _ in runs]):6.0f} MB/s, daemon "
                  f"CPU {median([c for _, c in runs]):.2f}s per {dataset.large_bytes // MiB} MiB")
    finally:
        mount.unmount()


def _while_attached(tracer: list[str], action: Callable[[], object]) -> float:
    """Seconds `action` took while `tracer` (strace or perf attached to the daemon) ran; the
    tracer gets a second to attach and half a second to catch the last replies."""
    process = subprocess.Popen(tracer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        seconds = timed(action)
        time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait()
    return seconds


def _scratch_file(suffix: str) -> Path:
    """An empty temporary file for a tracer to write; the caller unlinks it."""
    descriptor, name = tempfile.mkstemp(suffix=suffix)
    os.close(descriptor)
    return Path(name)


def _fuse_replies(pid: int, action: Callable[[], object]) -> int:
    """Replies the daemon writes to /dev/fuse (one per request) while `action` runs."""
    trace = _scratch_file(".strace")
    _while_attached(["strace", "-f", "-e", "trace=writev", "-o", str(trace), "-p", str(pid)],
                    action)
    count = sum(1 for line in trace.read_text().splitlines() if "writev(" in line)
    trace.unlink()
    return count


def probe_requests(server: s3server.Store, workdir: Path) -> None:
    """FUSE requests per small file read, on a mount that takes writes and on a read-only
    one (which answers FLUSH with ENOSYS, so the kernel stops sending it)."""
    _require("strace", "strace", "requests")
    dataset = make_dataset(0, 0, 300, 100 * 1024)
    write_local(workdir / "data", dataset)
    for options in ((), ("--read-only",)):
        set_aside(workdir / "cache", workdir)
        mount = _avafs_mount(server, workdir, dataset.small, workdir / "data", options)
        try:
            root = mount.mountpoint
            os.listdir(root / "small" / "000")
            for label in ("cold", "warm", "warm again"):
                replies = _fuse_replies(mount.pid,
                                        lambda root=root: read_all(root, dataset.small, 8))
                print(f"{' '.join(options) or 'read-write':11} {label:10} small-file reads: "
                      f"{replies / len(dataset.small):.1f} FUSE requests per file")
        finally:
            mount.unmount()


def probe_reads(server: s3server.Store, workdir: Path) -> None:
    """Cold (empty cache), warm (same mount) and remount (disk tier only, the cache dir's
    page cache dropped) reads of 4 x 64 MiB (one reader) and 1000 x 100 KiB files (8 readers),
    as the benchmark reads them, with the direct download's figures beside them. With `--base
    DIR` each round mounts the avafs under DIR too, beside this tree's, so a change is
    measured against the tree it changes in the same minutes (the machine's load moves), the
    order of the two reversed every other round. `--only` picks phases (READ_PHASES); each
    figure comes with the daemon's CPU seconds."""
    dataset = make_dataset(4, 64 * MiB, 1000, 100 * 1024)
    write_local(workdir / "data", dataset)
    client = server.client()
    s3server.upload_files(client, workdir / "data", dataset.large + dataset.small)
    only = set(_ARGS.only.split(",")) if _ARGS.only else set(READ_PHASES)
    results: dict[str, list[float]] = {}
    for number in range(_ARGS.rounds):
        size, seconds = timed_bytes(lambda: s3server.download_transfer(client, dataset.large))
        results.setdefault("direct   large MB/s", []).append(size / seconds / 1e6)
        _, seconds = timed_bytes(lambda: s3server.download_objects(client, dataset.small))
        results.setdefault("direct   small files/s", []).append(len(dataset.small) / seconds)
        for tree in _trees_in_turn(number):
            set_aside(workdir / "cache", workdir)
            mount = AvafsMount(server, workdir / "mnt", 2**30, 10 * 2**30)
            for label in ("cold", "warm", "remount"):
                if label == "remount":
                    mount.unmount()
                    drop_cached_pages(workdir / "cache")
                    mount.mount(workdir / "cache")
                elif label == "cold":
                    mount.mount(workdir / "cache")
                for kind, names, threads in (("large MB/s", dataset.large, 1),
                                             ("small files/s", dataset.small, 8)):
                    size_name = kind.split()[0]
                    if not any(phase.endswith(size_name) for phase in only) or \
                            (label != "cold" and f"{label}-{size_name}" not in only):
                        continue  # a cold read stays: a later phase needs what it cached
                    if label == "warm":
                        read_all(mount.mountpoint, names, threads)
                    before = cpu_seconds(mount.pid)
                    size, seconds = read_all(mount.mountpoint, names, threads)
                    rate = size / seconds / 1e6 if threads == 1 else len(names) / seconds
                    results.setdefault(f"{tree} {label:8} {kind}", []).append(rate)
                    results.setdefault(f"{tree} {label:8} {size_name} daemon CPU-s", []).append(
                        cpu_seconds(mount.pid) - before)
            mount.unmount()
    _print_medians(results)


def probe_per_connection(server: s3server.Store, workdir: Path) -> None:
    """Cold reads of 2 x 64 MiB by one reader (1 MiB reads, as the benchmark's cold large)
    through a store that serves each connection at `--rate` MB/s each way, as cloud object
    stores bound a connection (the tests' fault proxy in "slow" mode), against the direct
    8-thread download through the same proxy; each avafs tree in turn (`--base`). Also prints
    the most connections each avafs read had open through the proxy at once."""
    dataset = make_dataset(2, 64 * MiB, 0, 0)
    write_local(workdir / "data", dataset)
    s3server.upload_files(server.client(), workdir / "data", dataset.large)
    proxy = FaultProxy(urlparse(server.endpoint).port, rate=int(_ARGS.rate * 1e6))
    proxy.mode = "slow"
    client = s3server.make_client(proxy.endpoint)
    store = SimpleNamespace(endpoint=proxy.endpoint)
    results: dict[str, list[float]] = {}
    try:
        for number in range(_ARGS.rounds):
            size, seconds = timed_bytes(lambda: s3server.download_transfer(client,
                                                                           dataset.large))
            results.setdefault("direct   large MB/s", []).append(size / seconds / 1e6)
            for tree in _trees_in_turn(number):
                set_aside(workdir / "cache", workdir)
                mount = AvafsMount(store, workdir / "mnt", 2**30, 10 * 2**30)
                mount.mount(workdir / "cache")
                # Beyond the connections open before (the direct download's, kept alive).
                added = partial(lambda before: proxy.connections - before, proxy.connections)
                with PeakWatch(added, 0.01) as most:
                    size, seconds = read_all(mount.mountpoint, dataset.large, 1)
                results.setdefault(f"{tree} cold large MB/s", []).append(size / seconds / 1e6)
                results.setdefault(f"{tree} connections added, most", []).append(most.peak)
                mount.unmount()
    finally:
        proxy.close()
    print(f"every connection served at {_ARGS.rate:g} MB/s each way")
    _print_medians(results)


def probe_walk(server: s3server.Store, workdir: Path) -> None:
    """find/stat of the benchmark's tree (TREE_ENTRIES empty files, directories of 1,000) as
    the benchmark times it (`workloads.stat_tree`: the entries cached by one walk, then the
    median of repeated walks), on a fresh mount each round, against the same tree on local
    disk in the same round. `--base DIR` mounts the avafs under DIR too, as for `reads`."""
    names = tree_names(TREE_ENTRIES)
    s3server.put_empty(server.client(), names)
    write_tree(workdir / "local", names)
    results: dict[str, list[float]] = {}
    for number in range(_ARGS.rounds):
        results.setdefault("local entries/s", []).append(
            stat_tree(workdir / "local" / "tree", TREE_ENTRIES))
        for tree in _trees_in_turn(number):
            set_aside(workdir / "cache", workdir)
            mount = _bench_mount(server, workdir)
            before = cpu_seconds(mount.pid)
            results.setdefault(f"{tree} entries/s", []).append(
                stat_tree(mount.mountpoint / "tree", TREE_ENTRIES))
            results.setdefault(f"{tree} daemon CPU-s", []).append(cpu_seconds(mount.pid) - before)
            mount.unmount()
    _print_medians(results)


BATCH_FILES = 2000
BATCH_FILE_SIZE = 110 * 1024
BATCH = 64


def probe_batch_reads(server: s3server.Store, workdir: Path) -> None:
    """Batched whole-file reads after a remount (module docstring): each round and tree, a
    fresh cache dir filled by one batched pass, then an unmount, the cache dir's pages
    dropped, a remount, and the timed pass."""
    from avafs.client import Client

    names = [f"samples/{index // 100:03d}/{index:05d}.bin" for index in range(BATCH_FILES)]
    s3server.upload_small(server.client(), names, os.urandom(BATCH_FILE_SIZE))

    def read_batches(mount: AvafsMount) -> None:
        reader, paths = Client(mount.mountpoint), [mount.mountpoint / name for name in names]
        for first in range(0, len(paths), BATCH):
            if any(len(data) != BATCH_FILE_SIZE
                   for data in reader.read_files(paths[first:first + BATCH])):
                raise RuntimeError("a batched read returned a file of the wrong size")

    results: dict[str, list[float]] = {}
    for number in range(_ARGS.rounds):
        for tree in _trees_in_turn(number):
            set_aside(workdir / "cache", workdir)
            mount = AvafsMount(server, workdir / "mnt", 2**30, 10 * 2**30)
            mount.mount(workdir / "cache")
            read_batches(mount)
            mount.unmount()
            drop_cached_pages(workdir / "cache")
            mount.mount(workdir / "cache")
            before = cpu_seconds(mount.pid)
            seconds = timed(partial(read_batches, mount))
            results.setdefault(f"{tree} remount batch files/s", []).append(
                BATCH_FILES / seconds)
            results.setdefault(f"{tree} remount batch daemon CPU-s", []).append(
                cpu_seconds(mount.pid) - before)
            mount.unmount()
    _print_medians(results)


FIRST_WALK_DIRECTORIES = 1000
FIRST_WALK_FILES = 10
"""Files per directory in `first-walk`: the benchmark's ImageNet tree at --tree-files 10000."""


def probe_first_walk(server: s3server.Store, workdir: Path) -> None:
    """Seconds a walk (`os.walk`) of a fresh mount of FIRST_WALK_DIRECTORIES directories
    takes, the daemon's CPU beside it; each avafs tree in turn, every round."""
    names = [f"tree/c{directory:04d}/f{index:02d}" for directory in range(FIRST_WALK_DIRECTORIES)
             for index in range(FIRST_WALK_FILES)]
    s3server.put_empty(server.client(), names)
    proxy = FaultProxy(urlparse(server.endpoint).port, latency=_ARGS.list_latency)
    proxy.mode = "slow-list"
    store = SimpleNamespace(endpoint=proxy.endpoint)
    results: dict[str, list[float]] = {}
    try:
        for number in range(_ARGS.rounds):
            for tree in _trees_in_turn(number):
                set_aside(workdir / "cache", workdir)
                mount = _bench_mount(store, workdir)
                before, started = cpu_seconds(mount.pid), time.perf_counter()
                found = sum(len(files) for _, _, files in os.walk(mount.mountpoint / "tree"))
                results.setdefault(f"{tree} walk s", []).append(time.perf_counter() - started)
                results.setdefault(f"{tree} daemon CPU-s", []).append(
                    cpu_seconds(mount.pid) - before)
                mount.unmount()
                if found != len(names):
                    raise SystemExit(f"the walk found {found} files, expected {len(names)}")
    finally:
        proxy.close()
    print(f"{FIRST_WALK_DIRECTORIES} directories, LISTs answered {_ARGS.list_latency:g} s late")
    _print_medians(results)


def _trees_in_turn(number: int) -> Iterator[str]:
    """The avafs trees round `number` mounts, by name: this one, and `--base`'s before it,
    in reverse order every other round. Each is put on the daemons' PYTHONPATH in its turn."""
    trees = {"this": str(REPO)}
    if _ARGS.base:
        trees = {"base": str(Path(_ARGS.base).resolve()), **trees}
    for tree in (list(trees) if number % 2 == 0 else list(reversed(trees))):
        os.environ["PYTHONPATH"] = trees[tree]
        yield tree


def _print_medians(results: dict[str, list[float]]) -> None:
    for label, rates in sorted(results.items()):
        print(f"{label:34} {median(rates):8.2f}  (rounds: {', '.join(f'{r:.2f}' for r in rates)})")
    print(f"load average {' '.join(f'{value:.1f}' for value in os.getloadavg())}")


def timed_bytes(action: Callable[[], int]) -> tuple[int, float]:
    """(what `action` returned, its seconds)."""
    started = time.perf_counter()
    size = action()
    return size, time.perf_counter() - started


def probe_pyfuse3_ceiling(server: s3server.Store, workdir: Path) -> None:
    mountpoint = workdir / "trivial"
    mountpoint.mkdir()
    files = 2000
    process = subprocess.Popen([sys.executable, "-m", "bench.experiments.trivial_fs",
                                str(mountpoint), str(files)], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the trivial pyfuse3 file system did not mount")
            time.sleep(0.1)
        names = [f"f{index}" for index in range(files)]
        rates = []
        for _ in range(ROUNDS + 1):
            _, seconds = read_all(mountpoint, names, threads=8)
            rates.append(files / seconds)
        print(f"pyfuse3 ceiling, 16 KiB files, 8 readers: {median(rates[1:]):6.0f} files/s  "
              f"(first pass {rates[0]:.0f}; rounds: {', '.join(f'{r:.0f}' for r in rates[1:])})")
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        process.wait(timeout=30)


PAGE = 4096
_PAGEMAP_PRESENT = 1 << 63
_PAGEMAP_FRAME = (1 << 55) - 1
_KPF_COMPOUND_HEAD = 1 << 15
_KPF_COMPOUND_TAIL = 1 << 16


def _folio_shares(path: Path, pages: int = 16384) -> str:
    """How the kernel holds the first `pages` cached pages of `path`: each present page is a
    page of its own, or the head or a tail of a large folio (a compound page)."""
    counts: collections.Counter[str] = collections.Counter()
    with open(path, "rb") as file, \
            mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapping:
        pages = min(pages, len(mapping) // PAGE)
        for index in range(pages):
            mapping[index * PAGE]  # maps the cached page into this process
        start = next(int(line.split("-")[0], 16)
                     for line in Path("/proc/self/maps").read_text().splitlines()
                     if line.endswith(str(path)))
        try:
            with open("/proc/self/pagemap", "rb") as pagemap, \
                    open("/proc/kpageflags", "rb") as page_flags:
                for index in range(pages):
                    pagemap.seek((start // PAGE + index) * 8)
                    (entry,) = struct.unpack("<Q", pagemap.read(8))
                    if not entry & _PAGEMAP_PRESENT or not entry & _PAGEMAP_FRAME:
                        counts["not visible"] += 1
                        continue
                    page_flags.seek((entry & _PAGEMAP_FRAME) * 8)
                    (flags,) = struct.unpack("<Q", page_flags.read(8))
                    counts["folio head" if flags & _KPF_COMPOUND_HEAD else
                           "folio tail" if flags & _KPF_COMPOUND_TAIL else "single"] += 1
        except PermissionError:
            return "page flags not readable (needs root)"
    heads = counts["folio head"]
    folios = (f"{heads} large folios of {(heads + counts['folio tail']) * PAGE / heads / 1024:.0f}"
              " KiB on average" if heads else "no large folio")
    return (f"of its first {pages} pages {counts['single']} single pages, {folios}, "
            f"{counts['not visible']} not visible")


def probe_page_cache(server: s3server.Store, workdir: Path) -> None:
    name, size = "large/cached.bin", 256 * MiB
    root = workdir / "data"
    (root / "large").mkdir(parents=True)
    (root / name).write_bytes(os.urandom(size))
    local = workdir / "local.bin"
    shutil.copyfile(root / name, local)
    mount = _avafs_mount(server, workdir, [name], root)
    paths = {"local": local, "avafs": mount.mountpoint / name}
    rates: dict[str, list[float]] = {label: [] for label in paths}
    try:
        for path in paths.values():
            read_all(path.parent, [path.name], threads=1)  # into the page cache
        for _ in range(_ARGS.rounds):
            for label, path in paths.items():
                total, seconds = read_all(path.parent, [path.name], threads=1)
                rates[label].append(total / seconds / 1e6)
        for label, path in paths.items():
            print(f"{label:5}  {median(rates[label]):7.0f} MB/s from the page cache (rounds: "
                  f"{', '.join(f'{rate:.0f}' for rate in rates[label])}); "
                  f"{_folio_shares(path)}")
        print(f"avafs / local {median(rates['avafs']) / median(rates['local']):.2f}")
    finally:
        mount.unmount()


def _large_write_mount(server: s3server.Store, workdir: Path) -> tuple[WritePlan, AvafsMount]:
    """The benchmark's 1 GiB write, and a mount with the benchmark's cache sizes to take it."""
    return WritePlan.make(2**30, 0, 0), _bench_mount(server, workdir)


def probe_writes(server: s3server.Store, workdir: Path) -> None:
    """1 GiB written sequentially in 1 MiB writes, then the mount's flush (the time until
    durable in the store), against boto3's managed upload of the same file from local disk.

    Each phase also prints the CPU seconds the daemon and the server spent in it: a flush in
    which the daemon is idle and the server busy is the server completing the upload (moto
    joins the parts into one object on one core), not avafs still sending parts."""
    plan, mount = _large_write_mount(server, workdir)
    source = workdir / "large.bin"
    plan.write_source(source)
    rates: dict[str, list[float]] = {"avafs": [], "direct": []}

    def phase(action: Callable[[], object]) -> tuple[float, str]:
        daemon, store = cpu_seconds(mount.pid), _server_cpu(server)
        seconds = timed(action)
        return seconds, (f"{seconds:.1f} s (CPU: daemon {cpu_seconds(mount.pid) - daemon:.1f} s, "
                         f"server {_server_cpu(server) - store:.1f} s)")

    try:
        for number in range(ROUNDS):
            key = plan.large_name(f"probe-r{number}")
            written, write_line = phase(
                lambda key=key: plan.write_large(mount.mountpoint / key, durable=False))
            flushed, flush_line = phase(lambda: mount.flush(300, lambda: True))
            rates["avafs"].append(plan.large_size / (written + flushed) / 1e6)
            print(f"round {number}: avafs write {write_line} + flush {flush_line}", flush=True)
            seconds, direct_line = phase(lambda key=key: s3server.upload_large(
                server.client(), key + ".direct", source))
            rates["direct"].append(plan.large_size / seconds / 1e6)
            print(f"         direct upload {direct_line}", flush=True)
    finally:
        mount.unmount()
    for name, values in rates.items():
        print(f"{name:7} {median(values):6.1f} MB/s  (rounds: "
              f"{', '.join(f'{value:.1f}' for value in values)})")
    print(f"ratio   {median(rates['avafs']) / median(rates['direct']):.2f}x direct")


def _server_cpu(server: s3server.Store) -> float:
    """CPU seconds of the S3 server's processes so far (SeaweedFS runs several)."""
    if isinstance(server, s3server.MotoServer):
        return cpu_seconds(server.process.pid)
    return sum(cpu_seconds(process.pid) for process in server.cluster.processes
               if process.pid is not None)


def _perf_shares(recording: Path, sort: str, top: int) -> str:
    """The `top` largest shares of the samples in `recording`, by library or by symbol."""
    report = subprocess.run(["perf", "report", "-i", str(recording), "--stdio",
                             "--no-children", "-g", "none", "--sort", sort],
                            capture_output=True, text=True, check=True).stdout
    shares = [line.split(None, 1) for line in report.splitlines()
              if line.strip() and not line.startswith("#")]
    return ", ".join(f"{share} {name.strip()}" for share, name in shares[:top])


def probe_write_profile(server: s3server.Store, workdir: Path) -> None:
    """Where the daemon's CPU goes while 1 GiB is written and its parts go up: perf samples
    the whole process, so the kernel's copies and the hashing libraries show next to Python,
    which py-spy alone cannot weigh against them."""
    _require("perf", "linux-perf", "write-profile")
    plan, mount = _large_write_mount(server, workdir)
    try:
        for number in range(ROUNDS):
            recording = workdir / f"write-{number}.perf"
            path = mount.mountpoint / plan.large_name(f"profile-r{number}")
            before = cpu_seconds(mount.pid)
            seconds = _while_attached(
                ["perf", "record", "-F", "999", "-o", str(recording), "-p", str(mount.pid)],
                lambda path=path: plan.write_large(path, durable=False))
            spent = cpu_seconds(mount.pid) - before
            if not recording.exists():
                raise SystemExit(f"perf recorded nothing: {_PERF_DENIED}")
            mount.flush(300, lambda: True)
            print(f"round {number}: write {seconds:.1f} s, daemon {spent:.1f} CPU-s, by library: "
                  f"{_perf_shares(recording, 'dso', 5)}", flush=True)
            print(f"         by symbol: {_perf_shares(recording, 'sym', 4)}", flush=True)
    finally:
        mount.unmount()


def _context_switches(pid: int, action: Callable[[], object]) -> tuple[float, int]:
    """(seconds, context switches of every thread of `pid`) while `action` runs, counted by
    perf stat: threads that end meanwhile count too, which summing /proc/PID/task/*/status
    afterwards would miss."""
    counts = _scratch_file(".perfstat")
    seconds = _while_attached(["perf", "stat", "-e", "context-switches", "-x", ",",
                               "-o", str(counts), "-p", str(pid)], action)
    lines = [line for line in counts.read_text().splitlines() if "context-switches" in line]
    counts.unlink()
    if not lines or not lines[0].split(",")[0].isdigit():
        raise SystemExit(f"perf counted nothing: {_PERF_DENIED}")
    return seconds, int(lines[0].split(",")[0])


def probe_small_writes(server: s3server.Store, workdir: Path) -> None:
    """2000 x 100 KiB files from 8 writers until durable in the store (the benchmark's small
    writes, shorter), against the direct upload of as many objects. It also prints the
    daemon's CPU and thread switches per file: changes to the write path move those, while
    the ratio mostly follows this server's rate of PutObjects."""
    _require("perf", "linux-perf", "small-writes")
    if not _ARGS.latency:
        _small_write_rounds(server.endpoint, workdir)
        return
    proxy = FaultProxy(urlparse(server.endpoint).port, rate=10**10, latency=_ARGS.latency)
    proxy.mode = "link"
    print(f"every answer of the store {_ARGS.latency:g} s late, for avafs and the direct upload "
          "alike")
    try:
        _small_write_rounds(proxy.endpoint, workdir)
    finally:
        proxy.close()


def _small_write_rounds(endpoint: str, workdir: Path) -> None:
    plan = WritePlan.make(0, 2000, 100 * 1024)
    client = s3server.make_client(endpoint)
    mount = _bench_mount(SimpleNamespace(endpoint=endpoint), workdir)
    ratios: list[float] = []
    try:
        for number in range(ROUNDS):
            direct = timed(lambda number=number: s3server.upload_small(
                client, plan.small_names(f"direct-r{number}"), plan.small_payload))
            before = cpu_seconds(mount.pid)

            def write_until_durable(number: int = number) -> None:
                plan.write_small(mount.mountpoint, f"probe-r{number}", durable=False)
                mount.flush(300, lambda: True)

            seconds, switches = _context_switches(mount.pid, write_until_durable)
            cpu_ms = (cpu_seconds(mount.pid) - before) / plan.small_count * 1000
            ratios.append(direct / seconds)
            print(f"round {number}: avafs {plan.small_count / seconds:.0f} files/s, direct "
                  f"{plan.small_count / direct:.0f} ({direct / seconds:.2f}x); daemon "
                  f"{cpu_ms:.2f} CPU-ms and {switches / plan.small_count:.1f} context switches "
                  "per file", flush=True)
    finally:
        mount.unmount()
    print(f"ratio   {median(ratios):.2f}x direct (median of the rounds)")


PROBES = {"ranges": probe_ranges, "read-size": probe_read_size, "requests": probe_requests,
          "reads": probe_reads, "pyfuse3-ceiling": probe_pyfuse3_ceiling,
          "writes": probe_writes, "write-profile": probe_write_profile,
          "small-writes": probe_small_writes, "walk": probe_walk,
          "first-walk": probe_first_walk, "batch-reads": probe_batch_reads,
          "page-cache": probe_page_cache, "per-connection": probe_per_connection}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=sorted(PROBES))
    parser.add_argument("--store", choices=s3server.STORES, default=s3server.STORES[0],
                        help="the S3 server on loopback (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds of `reads`, `walk`, `first-walk`, `batch-reads`, "
                             "`page-cache` and `per-connection` "
                             "(default: %(default)s)")
    parser.add_argument("--base", metavar="DIR",
                        help="`reads`, `walk`, `first-walk`, `batch-reads` and `per-connection`: "
                             "a tree holding "
                             "another avafs package (such as `git archive main avafs | tar "
                             "-x -C DIR`), mounted in every round beside this one")
    parser.add_argument("--list-latency", type=float, default=0.0, metavar="S",
                        help="`first-walk` only: seconds each LIST is answered late "
                             "(default: %(default)s)")
    parser.add_argument("--latency", type=float, default=0.0, metavar="S",
                        help="`small-writes` only: seconds every answer of the store comes "
                             "late, as from a distant store (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=32.0, metavar="MB/S",
                        help="`per-connection` only: MB/s the store serves each connection "
                             "(default: %(default)s)")
    parser.add_argument("--only", metavar="PHASES",
                        help=f"`reads` only: comma-separated phases of {', '.join(READ_PHASES)} "
                             "(default: all)")
    parser.parse_args(namespace=_ARGS)
    unknown = set(_ARGS.only.split(",")) - set(READ_PHASES) if _ARGS.only else set()
    if unknown:
        parser.error(f"unknown phase {', '.join(sorted(unknown))}: pick from "
                     f"{', '.join(READ_PHASES)}")
    os.environ.update(s3server.CREDENTIALS)
    workdir = Path(tempfile.mkdtemp(prefix="avafs-probe-"))
    server = s3server.start_store(_ARGS.store, workdir)
    try:
        server.client().create_bucket(Bucket=s3server.BUCKET)
        PROBES[_ARGS.probe](server, workdir)
    finally:
        unmount_everything()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
