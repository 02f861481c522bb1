"""The fault soak: a mount used through every kind of store fault, checked for lost data and
for lookups that wait on the store.

Through bench/servers/fault_proxy.py between avafs and moto, each round injects each fault
(refused connections, resets, a store that accepts and never answers, a throttled link, a
store that trickles its answers' bodies a few bytes a second, 503 answers) for some seconds
while workers stat and look up files (existing and new names), read cached
files, read uncached ones, and write new files; then the store comes back, the mount is
flushed, and every file written is compared with the store's copy, byte for byte. Prints the
figures (faults injected, files and bytes written, lookups, the worst lookup or stat latency
per fault) and exits 1 if anything was lost or wrong, or a lookup or stat took longer than
--store-timeout plus a second of scheduling slack.

    python3 -m bench.soak.fault_soak [--rounds 3] [--seconds 10] [--store-timeout 3]
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.s3server import BUCKET, CREDENTIALS, MotoServer
from bench.servers.fault_proxy import FaultProxy

REPO = Path(__file__).resolve().parents[2]

MODES = ("refuse", "reset", "hang", "slow", "trickle", "503")
DIRECTORIES = 4
FILES_PER_DIRECTORY = 25
FILE_SIZE = 64 * 1024
SLACK = 1.0
"""Seconds a lookup may take past --store-timeout: thread scheduling on a loaded machine."""


def content(seed: str, size: int) -> bytes:
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


@dataclass
class Figures:
    lookups: int = 0
    worst: dict[str, float] = field(default_factory=dict)
    written: dict[str, bytes] = field(default_factory=dict)
    cached_reads: int = 0
    wrong_reads: list[str] = field(default_factory=list)
    cold: dict[str, list[int]] = field(default_factory=dict)
    """Reads of files not warmed beforehand, by fault: [answered, EIO]."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(self, mode: str, operation) -> object:
        started = time.monotonic()
        try:
            return operation()
        finally:
            elapsed = time.monotonic() - started
            with self.lock:
                self.lookups += 1
                self.worst[mode] = max(self.worst.get(mode, 0.0), elapsed)


def avafs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "avafs", *args], capture_output=True,
                          text=True, env={**os.environ, **CREDENTIALS,
                                          "PYTHONPATH": str(REPO)})


def seed(server: MotoServer) -> dict[str, bytes]:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    objects = {f"d{directory}/f{number}.bin": content(f"seed{directory}/{number}", FILE_SIZE)
               for directory in range(DIRECTORIES) for number in range(FILES_PER_DIRECTORY)}
    for key, data in objects.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return objects


def worker(mnt: Path, mode: str, objects: dict[str, bytes], warm: list[str],
           figures: Figures, stop: threading.Event, number: int) -> None:
    rng = random.Random(f"{mode}{number}")
    serial = 0
    while not stop.is_set():
        key = rng.choice(list(objects))
        figures.timed(mode, lambda key=key: os.stat(mnt / key))
        figures.timed(mode, lambda: os.path.exists(mnt / f"d0/absent-{rng.random()}"))
        hot = rng.choice(warm)
        data = (mnt / hot).read_bytes()
        with figures.lock:
            figures.cached_reads += 1
            if data != objects[hot]:
                figures.wrong_reads.append(hot)
        serial += 1
        name = f"out/{mode}/w{number}-{serial}.bin"
        payload = content(name, rng.randrange(1, 200_000))
        figures.timed(mode, lambda name=name: (mnt / name).parent.mkdir(parents=True,
                                                                          exist_ok=True))
        figures.timed(mode, lambda name=name: os.path.exists(mnt / name))
        (mnt / name).write_bytes(payload)
        with figures.lock:
            figures.written[name] = payload
        if serial % 2 == 0:
            cold = rng.choice([key for key in objects if key not in warm])
            try:
                data = (mnt / cold).read_bytes()
            except OSError as error:
                if error.errno != errno.EIO:
                    raise
                with figures.lock:
                    figures.cold.setdefault(mode, [0, 0])[1] += 1
                continue
            with figures.lock:
                figures.cold.setdefault(mode, [0, 0])[0] += 1
                if data != objects[cold]:
                    figures.wrong_reads.append(cold)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per fault and round")
    parser.add_argument("--store-timeout", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="avafs-soak-"))
    server = MotoServer(work / "moto.log")
    proxy = FaultProxy(server.port, rate=128 * 1024)
    mnt = work / "mnt"
    mnt.mkdir()
    started = time.monotonic()
    try:
        objects = seed(server)
        mounted = avafs("mount", f"s3://{BUCKET}", str(mnt), "--cache-dir", str(work / "cache"),
                        "--endpoint-url", proxy.endpoint, "--metadata-ttl", "1",
                        "--writeback-delay", "0.2", "--store-timeout", str(args.store_timeout))
        if mounted.returncode != 0:
            print(mounted.stderr, file=sys.stderr)
            return 1
        warm = [key for key in objects if key.endswith(("f0.bin", "f1.bin"))]
        for key in warm:
            (mnt / key).read_bytes()
        figures = Figures()
        flush_seconds: list[float] = []
        for _ in range(args.rounds):
            for mode in MODES:
                proxy.mode = mode
                stop = threading.Event()
                workers = [threading.Thread(target=worker, daemon=True,
                                            args=(mnt, mode, objects, warm, figures, stop, n))
                           for n in range(args.workers)]
                for thread in workers:
                    thread.start()
                time.sleep(args.seconds)
                stop.set()
                proxy.mode = "pass"
                for thread in workers:
                    thread.join()
                flush_started = time.monotonic()
                if avafs("flush", str(mnt)).returncode != 0:
                    print(f"flush after {mode} failed", file=sys.stderr)
                    return 1
                flush_seconds.append(time.monotonic() - flush_started)
        client = server.client()
        lost = [key for key in figures.written
                if _store_copy(client, key) != figures.written[key]]
    finally:
        proxy.mode = "pass"
        avafs("umount", str(mnt))
        proxy.close()
        server.stop()
    limit = args.store_timeout + SLACK
    worst = max(figures.worst.values())
    print(f"fault soak: {args.rounds} rounds x {len(MODES)} faults x {args.seconds:g}s, "
          f"{time.monotonic() - started:.0f}s in all")
    print(f"  faults injected: {proxy.faults} connections faulted (refusals not counted), "
          f"{args.rounds * len(MODES)} fault periods")
    print(f"  written: {len(figures.written)} files, "
          f"{sum(map(len, figures.written.values())) / 2**20:.1f} MiB; lost or wrong in the "
          f"store: {len(lost)}")
    print(f"  reads: {figures.cached_reads} of warmed files; of the others (cached once read), "
          "answered/EIO: "
          + ", ".join(f"{mode} {ok}/{eio}" for mode, (ok, eio) in figures.cold.items())
          + f"; wrong bytes: {len(figures.wrong_reads)}")
    print(f"  lookups and stats: {figures.lookups}; worst per fault: " + ", ".join(
        f"{mode} {seconds:.2f}s" for mode, seconds in figures.worst.items())
        + f" (limit {limit:g}s: --store-timeout {args.store_timeout:g} + {SLACK:g})")
    print(f"  worst flush once the store was back: {max(flush_seconds):.1f}s")
    failed = bool(lost or figures.wrong_reads or worst > limit)
    print("  result: " + ("FAILED" if failed else "ok"))
    if failed or os.path.ismount(mnt):
        print(f"  its folder is kept for a look (the store's log, the cache): {work}")
    else:
        shutil.rmtree(work)
    return 1 if failed else 0


def _store_copy(client, key: str) -> bytes | None:
    try:
        return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


if __name__ == "__main__":
    sys.exit(main())
