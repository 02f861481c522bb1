"""A trainer process for the elastic test: leases tasks, "trains", logs every consumed sample.

Run as a script by test_torch_elastic.py. It says when it is ready and waits for a go-file, so that
several trainers start consuming at the same moment, then runs one epoch of dynamic sharding through a DataLoader.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

from adapters.sharding import CoordinatorClient
from adapters.torch import AvaIterableDataset


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()

    dataset = AvaIterableDataset.from_prefix(
        args.data, coordinator=CoordinatorClient(args.coordinator, args.job), task_size=5,
        shuffle=True, seed=11, require_mount=False)
    loader = DataLoader(dataset, batch_size=4, num_workers=args.num_workers)
    Path(args.log + ".ready").touch()
    while not Path(args.go).exists():
        time.sleep(0.02)
    with open(args.log, "a") as log:
        for batch in dataset.acknowledged(loader):
            time.sleep(args.step_seconds)  # the training step
            print("\n".join(batch["__key__"]), file=log, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
