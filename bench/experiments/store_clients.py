"""boto3 in worker threads vs aiobotocore, for the store client avafs uses.

Both fetch the same ranged GETs (the block fetches of a cold read) from the same moto server,
with the same concurrency, several rounds alternating; prints medians and the ratio.

    python3 -m bench.experiments.store_clients [--blocks 64] [--block-size 4MiB] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

from avafs.config.sizes import parse_size
from bench.harness.common import median
from bench.harness.s3server import CREDENTIALS, MotoServer


def ranges(blocks: int, block_size: int) -> list[tuple[str, str]]:
    return [(f"obj{index % 4}", f"bytes={(index // 4) * block_size}-"
             f"{(index // 4 + 1) * block_size - 1}") for index in range(blocks)]


def boto3_threads(endpoint: str, work: list[tuple[str, str]], concurrency: int) -> float:
    client = boto3.client("s3", endpoint_url=endpoint,
                          config=Config(max_pool_connections=concurrency))
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda item: client.get_object(Bucket="bench", Key=item[0],
                                                     Range=item[1])["Body"].read(), work))
    return time.perf_counter() - started


def aiobotocore_tasks(endpoint: str, work: list[tuple[str, str]], concurrency: int) -> float:
    from aiobotocore.session import get_session

    async def run() -> float:
        session = get_session()
        limit = asyncio.Semaphore(concurrency)
        async with session.create_client(
                "s3", endpoint_url=endpoint,
                config=Config(max_pool_connections=concurrency)) as client:
            async def fetch(key: str, byte_range: str) -> None:
                async with limit:
                    reply = await client.get_object(Bucket="bench", Key=key, Range=byte_range)
                    async with reply["Body"] as body:
                        await body.read()

            started = time.perf_counter()
            await asyncio.gather(*(fetch(key, byte_range) for key, byte_range in work))
            return time.perf_counter() - started

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--block-size", type=parse_size, default=4 * 2**20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    with tempfile.TemporaryDirectory() as scratch:
        server = MotoServer(Path(scratch) / "moto.log")
        try:
            speeds = measure(server, args)
        finally:
            server.stop()
    print(f"{args.blocks} ranged GETs of {args.block_size} bytes, concurrency "
          f"{args.concurrency}, median of {args.rounds} rounds")
    for name, speed in speeds.items():
        print(f"  {name:14} {speed:8.1f} MiB/s")
    print(f"  ratio boto3 threads / aiobotocore: "
          f"{speeds['boto3 threads'] / speeds['aiobotocore']:.2f}")
    return 0


def measure(server: MotoServer, args: argparse.Namespace) -> dict[str, float]:
    endpoint = server.endpoint
    client = server.client()
    client.create_bucket(Bucket="bench")
    per_object = -(-args.blocks // 4) * args.block_size
    for index in range(4):
        client.put_object(Bucket="bench", Key=f"obj{index}", Body=os.urandom(per_object))
    work = ranges(args.blocks, args.block_size)
    total = args.blocks * args.block_size
    results: dict[str, list[float]] = {"boto3 threads": [], "aiobotocore": []}
    for _ in range(args.rounds):
        results["boto3 threads"].append(boto3_threads(endpoint, work, args.concurrency))
        results["aiobotocore"].append(aiobotocore_tasks(endpoint, work, args.concurrency))
    return {name: total / median(times) / 2**20 for name, times in results.items()}


if __name__ == "__main__":
    raise SystemExit(main())
