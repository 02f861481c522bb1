"""One training reader timed over warm epochs, run as its own process by the benchmark.

A process of its own because the pod's view needs one: `training.py` starts it inside a
private mount namespace (`unshare --mount`) whose tmpfs covers the mount's cache dir, so the
control socket is unreachable as in a pod that has a CSI volume bound in, and the adapters
read the mount directly. The same script reads the local copy and the host's view, so all
three run the same code. One untimed epoch first fills the caches the later epochs find;
then `--epochs` timed epochs. It prints one JSON line: the median samples/s, the median
CPU seconds per epoch of `--daemon-pid` (read from /proc, which the namespace still shows),
and the median busy cores of the whole machine during an epoch.

    python3 -m bench.harness.epoch_reader {torch,tf} ROOT --samples N [--workers N]
        [--epochs N] [--view {local,host,pod}] [--daemon-pid PID]

`--view` is checked before anything is timed: `host` must reach the mount's control socket,
`pod` must not (a namespace that failed to hide it would measure the host's view twice).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness.mounts import cpu_seconds
from bench.harness.profiling import MachineCpu

BATCH = 64


def check_view(root: Path, view: str) -> None:
    """Refuse to time a view that is not the one asked for."""
    if view == "local":
        return
    from adapters.mounts import client_for

    visible = client_for(root, require_mount=True) is not None
    if visible != (view == "host"):
        raise SystemExit(f"{view} view asked for, but the control socket of the mount holding "
                         f"{root} is {'visible' if visible else 'not visible'} here")


def torch_epochs(root: Path, workers: int, on_mount: bool) -> Callable[[], int]:
    """`AvaMapDataset` behind a shuffling DataLoader with persistent workers, as a training
    loop over a map-style dataset keeps them across epochs; each call runs one epoch."""
    from torch.utils.data import DataLoader

    from adapters.torch import AvaMapDataset

    dataset = AvaMapDataset.from_prefix(root, require_mount=on_mount)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, collate_fn=len)
    return lambda: sum(loader)


def tf_epochs(root: Path, workers: int, on_mount: bool) -> Callable[[], int]:
    """`adapters.tf.dataset` shuffled and batched; tf.data picks its own parallelism
    (AUTOTUNE), so `workers` does not apply."""
    from adapters.tf import dataset

    samples = dataset(root, shuffle=True, batch_size=BATCH, require_mount=on_mount)

    def epoch() -> int:
        return sum(int(batch["data"].shape[0]) for batch in samples)

    return epoch


READERS = {"torch": torch_epochs, "tf": tf_epochs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=READERS)
    parser.add_argument("root", type=Path)
    parser.add_argument("--samples", type=int, required=True,
                        help="samples an epoch must yield (a short epoch is an error)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (torch)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs")
    parser.add_argument("--view", choices=("local", "host", "pod"), default="local",
                        help="local: a plain directory; host: an avafs mount whose control "
                             "socket is reachable; pod: one whose socket is hidden")
    parser.add_argument("--daemon-pid", type=int, help="the serving process to charge CPU to")
    args = parser.parse_args()
    check_view(args.root, args.view)
    epoch = READERS[args.framework](args.root, args.workers, args.view != "local")
    epoch()
    rates, cpu, cores = [], [], []
    for _ in range(args.epochs):
        cpu_before = cpu_seconds(args.daemon_pid) if args.daemon_pid else 0.0
        with MachineCpu() as machine:
            started = time.perf_counter()
            seen = epoch()
            seconds = time.perf_counter() - started
        cores.append(machine.cores)
        if args.daemon_pid:
            cpu.append(cpu_seconds(args.daemon_pid) - cpu_before)
        if seen != args.samples:
            raise SystemExit(f"an epoch over {args.root} yielded {seen} samples, expected "
                             f"{args.samples}")
        rates.append(seen / seconds)
    print(json.dumps({"samples_per_s": statistics.median(rates),
                      "cpu_seconds": statistics.median(cpu) if cpu else None,
                      "machine_cores": statistics.median(cores)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
