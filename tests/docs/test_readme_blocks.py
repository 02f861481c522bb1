"""The READMEs' code blocks: each one runs in a test as written, or is marked as an excerpt.

A block is marked by the comment on the line above its fence: `<!-- excerpt -->`, or
`<!-- tested: FILE -->` naming the test file that runs it (through `support.run_example`, where
the paths and hosts the examples name are the test's own).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import TEST_CREDENTIALS, code_blocks, marked_block, run_example, write_aws_profile

pytestmark = pytest.mark.mount
REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
READMES = [README, REPO / "adapters" / "README.md"]


def blocks_fetched(test_file: Path) -> list[str]:
    """The starts of the blocks a test file runs: the literal last arguments of its calls of
    `marked_block(README, starting)` and of helpers around it named `..._block`."""
    return [call.args[-1].value for call in ast.walk(ast.parse(test_file.read_text()))
            if isinstance(call, ast.Call) and getattr(call.func, "id", "").endswith("_block")
            and call.args and isinstance(call.args[-1], ast.Constant)]


@pytest.mark.parametrize("readme", READMES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_code_block_runs_in_a_test_or_is_an_excerpt(readme):
    blocks = code_blocks(readme)
    assert blocks
    for block in blocks:
        where = f"{readme.name}:{block.line}"
        assert block.marker, f"{where}: mark the block <!-- excerpt --> or run it in a test"
        if block.marker.startswith("tested: "):
            test_file = REPO / block.marker.removeprefix("tested: ")
            assert any(block.text.startswith(start) for start in blocks_fetched(test_file)), (
                f"{where} is not run by {test_file}")
    fences = 0
    lines = readme.read_text().splitlines()
    for number, line in enumerate(lines):
        fences += line.startswith("```")
        if fences % 2 == 0 and re.match(r"^    \S", line) and not lines[number - 1].strip():
            raise AssertionError(f"{readme.name}:{number + 1}: an indented code block; fence "
                                 "and mark it")


S3_SETUP = f"""
{sys.executable} -m moto.server -H 127.0.0.1 -p 9000 > moto.log 2>&1 &
{sys.executable} - <<'PY'
import time
import boto3
s3 = boto3.client("s3", endpoint_url="http://minio:9000", region_name="us-east-1")
for attempt in range(600):
    try:
        s3.create_bucket(Bucket="datasets")
        break
    except Exception:
        time.sleep(0.1)
for index in range(12):
    s3.put_object(Bucket="datasets", Key=f"imagenet/train/{{index:02d}}.jpg", Body=b"jpeg")
PY
mkdir -p /srv/bucket /srv/scratch /mnt/imagenet /mnt/data /mnt/train
echo sample > /srv/bucket/sample.txt
echo notes > /srv/scratch/notes.txt
"""


def test_mounting_example_with_its_config(tmp_path):
    """`avafs mount` of an S3 bucket at `minio:9000`, of a local directory, and of the README's
    config as `avafs.yaml`, from the working directory that holds it."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "avafs.yaml").write_text(marked_block(README, "namespace:\n"))
    body = "\n".join([
        marked_block(README, "avafs mount s3://datasets/imagenet /mnt/imagenet"),
        "cat /mnt/data/sample.txt",
        "ls /mnt/train/imagenet/train | wc -l",
        "cat /mnt/train/scratch/notes.txt",
    ])
    result = run_example(tmp_path, body, setup=S3_SETUP, env=TEST_CREDENTIALS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["00.jpg", "01.jpg", "02.jpg", "03.jpg", "04.jpg", "05.jpg",
                                     "06.jpg", "07.jpg", "08.jpg", "09.jpg", "sample", "12",
                                     "notes"]


def test_warmup_status_refresh_flush_evict_example(tmp_path):
    bucket = tmp_path / "bucket"
    for directory, count in (("train", 6), ("val", 2), ("ckpt", 1), ("old", 2)):
        (bucket / directory).mkdir(parents=True)
        for index in range(count):
            (bucket / directory / f"{index}.bin").write_bytes(b"x" * 50_000)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.jsonl").write_text(
        "".join(json.dumps({"path": f"train/{index}.bin", "label": index}) + "\n"
                for index in range(6)))
    setup = (f"mkdir -p /mnt/imagenet\navafs mount {bucket.as_uri()} /mnt/imagenet "
             f"--cache-dir {tmp_path}/cache")
    result = run_example(tmp_path, marked_block(README, "avafs warmup /mnt/imagenet/train"),
                         setup=setup)
    assert result.returncode == 0, result.stderr
    output = result.stdout
    assert "warmup 1 done: 6 files" in output
    assert "cached: 6/6 files whole" in output
    assert "avafs mount /mnt/imagenet (pid " in output
    assert "refreshed /mnt/imagenet/train" in output
    assert "evicted " in output and " of 2 files" in output


_WITH_THE_USERS_MOUNT = """
import subprocess
import sys
from pathlib import Path

from support import run_example

for target in ("/mnt", "/mnt/imagenet"):
    Path(target).mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "users-mount", target], check=True)
result = run_example(Path(sys.argv[1]), sys.argv[2], setup=sys.argv[3])
print(result.stdout, end="")
print(result.stderr, end="", file=sys.stderr)
sys.exit(result.returncode)
"""


def test_examples_run_while_the_user_has_the_readmes_mount(tmp_path):
    """A user who followed "Mounting" has /mnt/imagenet mounted, and the examples mount there
    too: the harness must not see the host's mounts at the paths it gives the examples. (The
    user's mount is made in a namespace of this test's own, over a tmpfs at /mnt.)"""
    body = ("mkdir -p /mnt/imagenet\navafs mount file:///srv/bucket /mnt/imagenet\n"
            "cat /mnt/imagenet/sample.txt\navafs umount /mnt/imagenet")
    setup = "mkdir -p /srv/bucket\necho sample > /srv/bucket/sample.txt"
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
         _WITH_THE_USERS_MOUNT, str(tmp_path), body, setup],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sample"]


def profile_setup(tmp_path: Path) -> str:
    """S3_SETUP with the store's credentials only in the AWS profile `datasets` (nothing in the
    environment), as the README's fstab line and service take them."""
    config = write_aws_profile(tmp_path / "aws-config", "datasets")
    return (f"unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_PROFILE\n"
            f"export AWS_CONFIG_FILE={config}\n"
            f"AWS_PROFILE=datasets sh -e <<'SETUP'\n{S3_SETUP}\nSETUP")


def test_mount_type_and_fstab_examples(tmp_path):
    """`mount -t fuse.avafs`, then `mount MOUNTPOINT` of the README's /etc/fstab line, through
    the helper mount(8) finds in /sbin."""
    (tmp_path / "fstab").write_text(marked_block(README, "s3://datasets/imagenet "))
    setup = f"{profile_setup(tmp_path)}\nmount --bind {tmp_path}/fstab /etc/fstab"
    body = "\n".join([
        "export AWS_PROFILE=datasets",
        marked_block(README, "mount -t fuse.avafs s3://datasets/imagenet"),
        "unset AWS_PROFILE",
        "mount /mnt/imagenet",
        "ls /mnt/imagenet/train | wc -l",
        "touch /mnt/imagenet/new 2>/dev/null || echo read-only",
        "avafs umount /mnt/imagenet",
    ])
    result = run_example(tmp_path, body, setup=setup)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["00.jpg", "01.jpg", "02.jpg", "12", "read-only"]


def test_systemd_service_example(tmp_path):
    """The unit's ExecStart, as systemd runs it, mounts and logs to its stderr (the journal);
    its ExecStop unmounts, and the service's process ends."""
    unit = marked_block(README, "# /etc/systemd/system/avafs-imagenet.service")
    [start] = re.findall(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    [stop] = re.findall(r"^ExecStop=(.*)$", unit, re.MULTILINE)
    body = "\n".join([
        f"{start} &",
        "service=$!",
        "for attempt in $(seq 600); do mountpoint -q /mnt/imagenet && break; sleep 0.1; done",
        "ls /mnt/imagenet/train | wc -l",
        stop,
        "wait $service && echo stopped",
    ])
    result = run_example(tmp_path, body, setup=profile_setup(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["12", "stopped"]
    assert "INFO avafs: mounted s3://datasets/imagenet at /mnt/imagenet" in result.stderr
