"""adapters/README.md's examples, run as written against tiny data.

Each runs through `support.run_example` (private mount and network namespaces, where
`/mnt/imagenet`, `/var/lib/avafs` and the host `coordinator` are the test's own), with a bucket
the test writes mounted where the example expects it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from adapters_testlib import REPO, make_tar_shards, make_tfrecord_shards, write_manifest
from support import marked_block, run_example

pytestmark = pytest.mark.mount
README = REPO / "adapters" / "README.md"


def run_in_namespace(tmp_path: Path, bucket: Path, mountpoint: str, body: str
                     ) -> subprocess.CompletedProcess:
    """`body` (shell) with `bucket` mounted at `mountpoint`."""
    return run_example(tmp_path, body, setup=f"mkdir -p {mountpoint}\navafs mount "
                       f"{bucket.as_uri()} {mountpoint} --cache-dir {tmp_path}/cache")


def python_block(tmp_path: Path, starting: str) -> str:
    """A shell line that runs the README's Python block starting with `starting`."""
    script = tmp_path / f"block{len(list(tmp_path.glob('block*.py')))}.py"
    script.write_text(marked_block(README, starting))
    return f"python3 {script}"


def imagenet_bucket(tmp_path: Path) -> Path:
    bucket = tmp_path / "bucket"
    make_tar_shards(bucket / "train", [30, 25, 40, 5])
    (bucket / "val").mkdir()
    for index in range(3):
        (bucket / "val" / f"{index}.bin").write_bytes(b"v" * 10)
    write_manifest(bucket / "val.jsonl", [{"path": f"val/{index}.bin", "label": 7 - index}
                                         for index in range(3)])
    return bucket


def test_pytorch_example(tmp_path):
    result = run_in_namespace(tmp_path, imagenet_bucket(tmp_path), "/mnt/imagenet",
                              python_block(tmp_path, "from torch.utils.data import DataLoader\n"
                                                     "from adapters.torch import"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum(int(line.split()[5]) for line in lines if line.startswith("epoch 0:")) == 100
    assert sum(int(line.split()[5]) for line in lines if line.startswith("epoch 1:")) == 100
    assert lines[-1] == "3 validation samples, the first labelled 7"


def test_elastic_example(tmp_path):
    serve = marked_block(README, "python3 -m adapters.sharding serve").strip()
    status = marked_block(README, "python3 -m adapters.sharding status").strip()
    body = "\n".join([
        f"{serve} > serve.log 2>&1 &",
        python_block(tmp_path, "from torch.utils.data import DataLoader\n"
                               "from adapters.sharding import"),
        status,
    ])
    result = run_in_namespace(tmp_path, imagenet_bucket(tmp_path), "/mnt/imagenet", body)
    assert result.returncode == 0, result.stderr
    trained = [int(line.split()[2]) for line in result.stdout.splitlines()
               if line.startswith("trained on ")]
    assert sum(trained) == 200  # two epochs of 100 samples, each acknowledged once
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["acked_samples"] == 100


def test_tensorflow_example(tmp_path):
    bucket = tmp_path / "bucket"
    make_tfrecord_shards(bucket / "train", [20, 12])
    result = run_in_namespace(tmp_path, bucket, "/mnt/data",
                              python_block(tmp_path, "import tensorflow as tf\n"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "a first batch of 32 records"
    assert list((tmp_path / "work" / "ckpt").iterdir())
