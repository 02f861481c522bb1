"""The quickstart's main job: a sample local bucket, mounted, read twice.

It shows on one machine, with no server, what avafs does for a training job: the first epoch
reads through the mount into the cache, the second is served from it. The sample bucket and
the cache (about 700 MiB by default) are removed at the end, unless --keep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from contextlib import suppress
from pathlib import Path

from avafs.client import Client
from avafs.config.sizes import format_size
from bench.harness.common import MiB, avafs, make_dataset, read_all, write_local


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "avafs-quickstart",
                        help="a directory of the quickstart's own (default: %(default)s)")
    parser.add_argument("--large", type=int, default=4, help="64 MiB files (default 4)")
    parser.add_argument("--small", type=int, default=1000, help="100 KiB files (default 1000)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sample bucket and the cache under --workdir (default: "
                             "removed at the end)")
    args = parser.parse_args()

    made = tuple(args.workdir / name for name in ("bucket", "mnt", "cache"))
    try:
        return _run(args, *made)
    finally:
        if not args.keep:
            _remove(args.workdir, made)


def _remove(workdir: Path, made: tuple[Path, ...]) -> None:
    """Remove what the quickstart made under `workdir`, and `workdir` if that empties it;
    never through a mount still there (it would delete the files it serves)."""
    for path in made:
        if not os.path.ismount(path):
            shutil.rmtree(path, ignore_errors=True)
    with suppress(OSError):
        workdir.rmdir()
    print(f"removed the sample bucket and the cache from {workdir} (--keep keeps them)")


def _run(args: argparse.Namespace, bucket: Path, mountpoint: Path, cache: Path) -> int:
    dataset = make_dataset(args.large, 64 * MiB, args.small, 100 * 1024)
    print(f"sample bucket: {bucket} ({args.large} x 64 MiB, {args.small} x 100 KiB)")
    write_local(bucket, dataset)
    mountpoint.mkdir(parents=True, exist_ok=True)
    avafs("evict", str(mountpoint), check=False)
    if cache.exists():
        shutil.rmtree(cache)
    avafs("mount", bucket.as_uri(), str(mountpoint), "--cache-dir", str(cache),
          "--ram-cache", "512MiB", "--disk-cache", "2GiB")
    print(f"mounted {bucket.as_uri()} at {mountpoint}")
    try:
        for epoch in ("cold (epoch 1)", "warm (epoch 2)"):
            large_bytes, large_seconds = read_all(mountpoint, dataset.large, threads=1)
            small_bytes, small_seconds = read_all(mountpoint, dataset.small, threads=8)
            print(f"{epoch:15} large files: {large_bytes / large_seconds / MiB:8.0f} MiB/s   "
                  f"small files: {len(dataset.small) / small_seconds:8.0f} files/s")
        status = Client(mountpoint).status()
        served = status["bytes_served"]
        print(f"hit ratio {status['hit_ratio']:.1%}: served {format_size(served['ram'])} from "
              f"RAM, {format_size(served['disk'])} from disk, {format_size(served['store'])} "
              f"from the bucket (warm re-reads beyond that come from the kernel page cache)")
    finally:
        avafs("umount", str(mountpoint))
        print(f"unmounted {mountpoint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
