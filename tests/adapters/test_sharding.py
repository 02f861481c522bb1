"""The elastic-sharding coordinator: exactly-once accounting, durability, and the service CLI.

Stores are real (a SQLite file, and a real etcd server); lease expiry in the logic tests is driven
by the coordinator's clock argument so they do not sleep through TTLs.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from adapters_testlib import REPO, stop_process

from adapters.sharding import (
    AckResult,
    Coordinator,
    CoordinatorClient,
    CoordinatorError,
    JobSpec,
    Lease,
)
from adapters.sharding_store import open_store


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "etcd"])
def state_spec(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "coordinator.db")
    etcd = request.getfixturevalue("etcd")
    return f"{etcd.url}/test-{uuid.uuid4().hex[:8]}/"


def lease_of(coordinator: Coordinator, job: str, worker: str, epoch: int = 0) -> Lease:
    answer = coordinator.lease(job, epoch, worker)
    assert answer["lease"] is not None, answer
    return Lease(**answer["lease"])


def test_late_ack_from_expired_lease_is_not_counted(state_spec):
    clock = Clock()
    coordinator = Coordinator(open_store(state_spec), lease_ttl=10, clock=clock)
    coordinator.register("job", JobSpec(num_items=10, task_size=3, fingerprint="f"))

    first = lease_of(coordinator, "job", "worker-a")
    second = lease_of(coordinator, "job", "worker-b")
    assert (first.task, first.start, first.stop) == (0, 0, 3)
    assert (second.task, second.start, second.stop) == (1, 3, 6)

    clock.now += 11  # worker-a's lease expires; its task is the first to be handed out again
    retry = lease_of(coordinator, "job", "worker-c")
    assert (retry.task, retry.attempt) == (0, 2)
    assert coordinator.ack("job", 0, 0, first.token, samples=3)["result"] == "stale"
    assert coordinator.renew("job", 0, 0, first.token) == {"renewed": False}
    assert coordinator.ack("job", 0, 0, retry.token, samples=3)["result"] == "accepted"
    assert coordinator.ack("job", 0, 0, retry.token, samples=3)["result"] == "duplicate"
    assert coordinator.ack("job", 0, 0, first.token, samples=3)["result"] == "stale"

    assert coordinator.ack("job", 0, 1, second.token, samples=3)["result"] == "accepted"
    rest = [lease_of(coordinator, "job", "worker-c") for _ in range(2)]
    assert [lease.task for lease in rest] == [2, 3]
    assert coordinator.lease("job", 0, "worker-c") == {"lease": None, "done": False}
    for lease in rest:
        coordinator.ack("job", 0, lease.task, lease.token, samples=lease.stop - lease.start)

    status = coordinator.status("job", 0)
    assert status["done"] is True
    assert coordinator.lease("job", 0, "worker-d") == {"lease": None, "done": True}
    assert (status["acked_tasks"], status["acked_items"], status["acked_samples"]) == (4, 10, 10)
    assert status["acked_attempts"] == {"0": 2, "1": 1, "2": 1, "3": 1}
    assert status["leases_granted"] == 5
    assert coordinator.status("job", 1)["acked_tasks"] == 0  # epochs are independent


def test_renewed_lease_survives_and_released_task_returns_at_once(state_spec):
    clock = Clock()
    coordinator = Coordinator(open_store(state_spec), lease_ttl=10, clock=clock)
    coordinator.register("job", JobSpec(num_items=2, task_size=1, fingerprint="f"))
    kept = lease_of(coordinator, "job", "a")
    handed_back = lease_of(coordinator, "job", "b")

    clock.now += 8
    assert coordinator.renew("job", 0, kept.task, kept.token)["renewed"] is True
    assert coordinator.release("job", 0, handed_back.task, handed_back.token) == {"released": True}
    clock.now += 8  # past the original expiry, within the renewed one
    taken_over = lease_of(coordinator, "job", "c")
    assert (taken_over.task, taken_over.attempt) == (handed_back.task, 2)
    assert coordinator.lease("job", 0, "c") == {"lease": None, "done": False}
    assert coordinator.ack("job", 0, kept.task, kept.token, samples=1)["result"] == "accepted"


def test_trainers_with_different_listings_are_refused(tmp_path):
    coordinator = Coordinator(open_store(str(tmp_path / "state.db")))
    coordinator.register("job", JobSpec(num_items=5, task_size=2, fingerprint="5-aaaa"))
    coordinator.register("job", JobSpec(num_items=5, task_size=2, fingerprint="5-aaaa"))
    with pytest.raises(CoordinatorError, match="every trainer must list the same dataset"):
        coordinator.register("job", JobSpec(num_items=6, task_size=2, fingerprint="6-bbbb"))
    with pytest.raises(CoordinatorError, match="unknown job 'other'"):
        coordinator.lease("other", 0, "w")


def test_coordinator_restart_loses_no_progress(state_spec, coordinator_service):
    service = coordinator_service(state_spec, lease_ttl=30)
    client = CoordinatorClient(service.url, "restart", retry_for=60)
    client.register(JobSpec(num_items=50, task_size=10, fingerprint="f"))
    leases = [client.lease(0, "trainer") for _ in range(3)]
    assert all(lease is not None for lease in leases)
    assert client.ack(leases[0], samples=10) is AckResult.ACCEPTED
    assert client.ack(leases[1], samples=10) is AckResult.ACCEPTED

    service.kill()
    answers: list[AckResult] = []
    late_ack = threading.Thread(target=lambda: answers.append(client.ack(leases[2], samples=10)))
    late_ack.start()  # the trainer keeps retrying while the coordinator is down
    time.sleep(0.5)
    service.start()
    late_ack.join(timeout=60)

    assert answers == [AckResult.ACCEPTED]
    assert client.ack(leases[0], samples=10) is AckResult.DUPLICATE
    status = client.status(0)
    assert (status["acked_tasks"], status["acked_samples"], status["leases_granted"]) == (3, 30, 3)
    remaining = [client.lease(0, "trainer") for _ in range(3)]
    assert [lease.task for lease in remaining if lease] == [3, 4]


class _CutOnce(BaseHTTPRequestHandler):
    """A coordinator that dies while it replies, once: its first answer announces a body and
    ends before it; the next is whole."""

    answered: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the name BaseHTTPRequestHandler calls
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"lease_ttl": 2.5}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self.answered:
            self.answered.append("cut")
            self.close_connection = True
            return
        self.answered.append("whole")
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads what was answered from `answered`, not from stderr."""


def test_an_answer_cut_off_mid_reply_is_asked_again():
    _CutOnce.answered.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutOnce)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = CoordinatorClient(f"http://127.0.0.1:{server.server_address[1]}", "cut",
                                   retry_for=10)
        assert client.lease_ttl() == 2.5
    finally:
        server.shutdown()
        server.server_close()
    assert _CutOnce.answered == ["cut", "whole"]


def test_lease_held_at_restart_gets_a_full_ttl(tmp_path, coordinator_service):
    service = coordinator_service(str(tmp_path / "state.db"), lease_ttl=3)
    client = CoordinatorClient(service.url, "grace")
    client.register(JobSpec(num_items=1, task_size=1, fingerprint="f"))
    held = client.lease(0, "trainer")
    assert held is not None
    service.kill()
    time.sleep(3.5)  # the stored expiry passes while the coordinator is down
    service.start()
    assert client.lease(0, "other") is None  # the holder could not renew: it is not presumed dead
    assert client.renew(held) is True
    assert client.ack(held, samples=1) is AckResult.ACCEPTED


def run_serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adapters.sharding", "serve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "message"), [
    (["--state", "s3://bucket/state", "--port", "0"], "must be a file path or etcd://HOST:PORT"),
    (["--state", "/etc/hostname/dir/state.db", "--port", "0"],
     "/etc/hostname/dir: cannot create the directory for the state file (Not a directory)"),
    (["--state", "etcd://127.0.0.1", "--port", "0"], "expected etcd://HOST:PORT"),
    (["--state", "state.db", "--port", "0", "--lease-ttl", "-3"], "must be a positive number"),
])
def test_serve_rejects_bad_input_with_one_line(args, message):
    result = run_serve(*args)
    assert result.returncode == 2
    error_line = result.stderr.strip().splitlines()[-1]  # argparse prints its usage above it
    assert error_line.startswith("python -m adapters.sharding serve: ")
    assert message in error_line


def test_serve_creates_the_state_file_directory(tmp_path):
    state = tmp_path / "var" / "lib" / "avafs" / "sharding.db"
    service = subprocess.Popen([sys.executable, "-m", "adapters.sharding", "serve", "--state",
                                str(state), "--port", "0"], cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert service.stdout.readline().startswith("adapters.sharding: serving http://")
        assert state.is_file()
    finally:
        stop_process(service)


def test_serve_reports_unreachable_etcd():
    from support import free_port

    result = run_serve("--state", f"etcd://127.0.0.1:{free_port()}", "--port", "0")
    assert result.returncode == 2
    assert result.stderr.startswith("python -m adapters.sharding serve: error: etcd at 127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_status_command_prints_progress(tmp_path, coordinator_service):
    service = coordinator_service(str(tmp_path / "state.db"))
    client = CoordinatorClient(service.url, "cli")
    client.register(JobSpec(num_items=4, task_size=2, fingerprint="f"))
    lease = client.lease(0, "w")
    assert lease is not None
    client.ack(lease, samples=2)
    result = subprocess.run([sys.executable, "-m", "adapters.sharding", "status", "--coordinator",
                             service.url, "--job", "cli"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"acked_tasks": 1' in result.stdout and '"done": false' in result.stdout
