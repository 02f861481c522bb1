"""Elastic run: three trainers share an epoch, one is killed mid-epoch, a fourth joins, and the
coordinator itself is killed and restarted while they work.

Real trainer processes (two of them with DataLoader worker processes) against a real coordinator
service. Outcome checked: every sample was consumed by some trainer at least once, and the
coordinator counted every task, and so every sample, exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from adapters_testlib import REPO, make_files, stop_process

from adapters.sharding import CoordinatorClient

TRAINER = str(Path(__file__).with_name("elastic_trainer.py"))


@pytest.mark.parametrize("state", ["sqlite", "etcd"])
def test_killed_trainer_work_is_redone_and_counted_once(tmp_path, coordinator_service, child_env,
                                                         state, request):
    keys = make_files(tmp_path / "data", 200)
    if state == "sqlite":
        spec = str(tmp_path / "state.db")
    else:
        spec = f"{request.getfixturevalue('etcd').url}/elastic-{tmp_path.name}/"
    service = coordinator_service(spec, lease_ttl=2)
    go, late_go = tmp_path / "go", tmp_path / "go-late"

    def trainer(name: str, start_file: Path, num_workers: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, TRAINER, "--coordinator", service.url, "--job", "elastic",
             "--data", str(tmp_path / "data"), "--log", str(tmp_path / f"{name}.log"),
             "--go", str(start_file), "--num-workers", str(num_workers)],
            cwd=REPO, env=child_env, stderr=open(tmp_path / f"{name}.err", "wb"))  # noqa: SIM115

    trainers = {"a": trainer("a", go, 2), "b": trainer("b", go, 2), "c": trainer("c", go, 0),
                "d": trainer("d", late_go, 0)}
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"{name}.log.ready").exists() for name in trainers):
            assert time.monotonic() < deadline, "trainers did not start"
            time.sleep(0.05)
        go.touch()
        while _consumed(tmp_path / "a.log") < 12:
            assert time.monotonic() < deadline and trainers["a"].poll() is None
            time.sleep(0.05)
        stop_process(trainers["a"], signal.SIGKILL)  # dies holding leases and prefetched samples
        late_go.touch()
        time.sleep(0.5)
        service.kill()  # trainers keep retrying; nothing acknowledged may be lost
        time.sleep(1)
        service.start()
        for name in "bcd":
            assert trainers[name].wait(timeout=120) == 0, (tmp_path / f"{name}.err").read_text()
    finally:
        for process in trainers.values():
            stop_process(process, signal.SIGKILL)

    seen = Counter()
    for name in "abcd":
        seen.update(_keys(tmp_path / f"{name}.log"))
    assert set(seen) == set(keys)  # at least once
    assert _consumed(tmp_path / "d.log") > 0  # the late trainer took part

    status = CoordinatorClient(service.url, "elastic").status(0)
    assert status["done"] is True
    assert (status["acked_tasks"], status["acked_items"], status["acked_samples"]) == (40, 200, 200)
    assert status["leases_granted"] > 40  # the killed trainer's tasks were leased again


def _keys(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _consumed(log: Path) -> int:
    return len(_keys(log))
