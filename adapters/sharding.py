"""Dynamic (elastic) data sharding: a coordinator hands out an epoch as leased tasks.

An epoch of N items (files or shards) is cut into tasks of `task_size` consecutive positions of the
epoch's item order. Trainers lease tasks, read them, and acknowledge each one once every sample of
it has been consumed by a training step. A lease that is not renewed expires (the trainer died or
was preempted) and its task goes back to the queue; trainers may join or leave at any time; the
epoch is complete when every task is acknowledged. This is ElasticDL's dynamic data partitioning.

The guarantee (adapters/README.md states it for users): every sample of an epoch is delivered to
some trainer at least once, and is counted exactly once. Counting is exact because a task is
acknowledged only through its current lease (task, attempt, token): a late ack from an expired
lease whose task was re-leased is answered `stale` and not counted, and a repeated ack is answered
`duplicate` and not counted again. Every state change is written to the durable store before the
coordinator answers, so a coordinator restart loses no acknowledgement and no lease.

Parts: `Coordinator` (the logic over a `StateStore`), `serve` (a stdlib HTTP/JSON service,
`python -m adapters.sharding serve`) and `CoordinatorClient` (what trainers use). The trainer side
(tagging samples with leases, acknowledging after the training step) is `adapters/elastic.py`.
"""

from __future__ import annotations

import argparse
import enum
import http.client
import json
import logging
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from adapters.sharding_store import StateStore, VersionConflict, Versioned, open_store

log = logging.getLogger(__name__)

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LEASED, RELEASED, ACKED = "leased", "released", "acked"
DEFAULT_LEASE_TTL = 60.0


class CoordinatorError(RuntimeError):
    """A request the coordinator refuses; the message says why and what to change."""


class CoordinatorUnavailable(ConnectionError):
    """The coordinator did not answer within the client's retry window."""


class AckResult(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What every trainer of a job must agree on; the fingerprint catches differing listings."""

    num_items: int
    task_size: int
    fingerprint: str

    def __post_init__(self) -> None:
        if self.num_items < 1 or self.task_size < 1:
            raise CoordinatorError(f"a job needs num_items >= 1 and task_size >= 1, got {self}")

    @property
    def num_tasks(self) -> int:
        return -(-self.num_items // self.task_size)

    def task_items(self, task: int) -> tuple[int, int]:
        start = task * self.task_size
        return start, min(start + self.task_size, self.num_items)


@dataclass(frozen=True, slots=True)
class Lease:
    """One grant of a task: positions [start, stop) of the epoch's item order, until expires_at.

    `attempt` counts the grants of this task; `token` tells this grant from every other, so an
    ack through an older grant can be recognised as stale.
    """

    job: str
    epoch: int
    task: int
    token: str
    attempt: int
    start: int
    stop: int
    expires_at: float
    ttl: float


class LeaseRef(Protocol):
    """Names one lease of one task: a `Lease`, or the tag its samples carry."""

    @property
    def epoch(self) -> int: ...

    @property
    def task(self) -> int: ...

    @property
    def token(self) -> str: ...


class _EpochTasks:
    """The coordinator's in-memory mirror of one epoch's task records."""

    def __init__(self, records: dict[int, Versioned], num_tasks: int) -> None:
        self.records = records
        self.num_tasks = num_tasks
        self.next_new = next((task for task in range(num_tasks) if task not in records), num_tasks)

    def advance_next_new(self) -> None:
        while self.next_new < self.num_tasks and self.next_new in self.records:
            self.next_new += 1


class Coordinator:
    """Task leasing over a durable store; one coordinator process serves many jobs.

    Leases carry absolute expiry times in the store. Trainers cannot renew while the coordinator
    is down, so after a restart every lease gets at least one full TTL from the restart before it
    can be reclaimed: a restart never turns live trainers into "dead" ones.
    """

    def __init__(self, store: StateStore, lease_ttl: float = DEFAULT_LEASE_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        if lease_ttl <= 0:
            raise ValueError(f"lease TTL must be positive, got {lease_ttl}")
        self.store = store
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.started_at = clock()
        self._lock = threading.Lock()
        self._jobs: dict[str, JobSpec] = {}
        self._epochs: dict[tuple[str, int], _EpochTasks] = {}

    def register(self, job: str, spec: JobSpec) -> JobSpec:
        with self._lock:
            existing = self._stored_job(job)
            if existing is None:
                self._write(f"jobs/{job}", asdict(spec), 0)
                self._jobs[job] = spec
                return spec
            if existing != spec:
                raise CoordinatorError(
                    f"job {job!r} is registered with {existing.num_items} items in tasks of "
                    f"{existing.task_size} (listing {existing.fingerprint}), but this trainer has "
                    f"{spec.num_items} items in tasks of {spec.task_size} (listing "
                    f"{spec.fingerprint}): every trainer must list the same dataset")
            return existing

    def lease(self, job: str, epoch: int, worker: str) -> dict[str, Any]:
        """{"lease": {...}} or, when nothing is leasable now, {"lease": None, "done": bool}."""
        with self._lock:
            spec = self._job(job)
            tasks = self._epoch(job, epoch, spec)
            now = self.clock()
            task = self._reclaimable(tasks, now)
            if task is None and tasks.next_new < spec.num_tasks:
                task = tasks.next_new
            if task is None:
                return {"lease": None, "done": self._acked(tasks) == spec.num_tasks}
            current = tasks.records.get(task)
            attempt = 1 if current is None else current.value["attempt"] + 1
            record = {"state": LEASED, "attempt": attempt, "token": uuid.uuid4().hex[:16],
                      "worker": worker, "expires_at": now + self.lease_ttl}
            self._put_task(job, epoch, tasks, task, record)
            tasks.advance_next_new()
            start, stop = spec.task_items(task)
            lease = Lease(job, epoch, task, record["token"], attempt, start, stop,
                          record["expires_at"], self.lease_ttl)
            return {"lease": asdict(lease)}

    def renew(self, job: str, epoch: int, task: int, token: str) -> dict[str, Any]:
        """Extends a current lease; {"renewed": False} tells the holder its task went elsewhere."""
        with self._lock:
            tasks = self._epoch(job, epoch, self._job(job))
            current = self._task(tasks, task)
            if current.value["state"] != LEASED or current.value["token"] != token:
                return {"renewed": False}
            expires_at = self.clock() + self.lease_ttl
            self._put_task(job, epoch, tasks, task, {**current.value, "expires_at": expires_at})
            return {"renewed": True, "expires_at": expires_at}

    def ack(self, job: str, epoch: int, task: int, token: str, samples: int) -> dict[str, Any]:
        with self._lock:
            tasks = self._epoch(job, epoch, self._job(job))
            current = self._task(tasks, task)
            value = current.value
            if value["state"] == ACKED:
                result = AckResult.DUPLICATE if value["token"] == token else AckResult.STALE
            elif value["token"] != token:
                result = AckResult.STALE
            else:
                self._put_task(job, epoch, tasks, task, {**value, "state": ACKED,
                                                         "samples": samples,
                                                         "acked_at": self.clock()})
                result = AckResult.ACCEPTED
            return {"result": result.value}

    def release(self, job: str, epoch: int, task: int, token: str) -> dict[str, Any]:
        """A trainer leaving gracefully hands its task back without waiting for the TTL."""
        with self._lock:
            tasks = self._epoch(job, epoch, self._job(job))
            current = self._task(tasks, task)
            if current.value["state"] != LEASED or current.value["token"] != token:
                return {"released": False}
            self._put_task(job, epoch, tasks, task, {**current.value, "state": RELEASED})
            return {"released": True}

    def status(self, job: str, epoch: int) -> dict[str, Any]:
        with self._lock:
            spec = self._job(job)
            tasks = self._epoch(job, epoch, spec)
            now = self.clock()
            states = Counter(record.value["state"] for record in tasks.records.values())
            live = [self._expiry(record) - now for record in tasks.records.values()
                    if record.value["state"] == LEASED and self._expiry(record) > now]
            acked = {task: record.value for task, record in tasks.records.items()
                     if record.value["state"] == ACKED}
            leasable = (spec.num_tasks - len(tasks.records)) + sum(
                1 for record in tasks.records.values() if self._is_reclaimable(record, now))
            return {
                "job": job, "epoch": epoch, "num_items": spec.num_items,
                "num_tasks": spec.num_tasks, "acked_tasks": states[ACKED],
                "acked_items": sum(stop - start for start, stop in map(spec.task_items, acked)),
                "acked_samples": sum(value["samples"] for value in acked.values()),
                "leased_tasks": len(live), "leasable_tasks": leasable,
                "leases_granted": sum(record.value["attempt"] for record in tasks.records.values()),
                "acked_attempts": {str(task): value["attempt"] for task, value in sorted(acked.items())},
                "next_expiry_in": min(live) if live else None,
                "done": states[ACKED] == spec.num_tasks,
            }

    def _job(self, job: str) -> JobSpec:
        spec = self._stored_job(job)
        if spec is None:
            raise CoordinatorError(f"unknown job {job!r}: register it first")
        return spec

    def _stored_job(self, job: str) -> JobSpec | None:
        if not JOB_NAME.match(job):
            raise CoordinatorError(f"invalid job name {job!r}: use letters, digits, '.', '_', '-'")
        if job not in self._jobs:
            stored = self.store.get(f"jobs/{job}")
            if stored is None:
                return None
            self._jobs[job] = JobSpec(**stored.value)
        return self._jobs[job]

    def _epoch(self, job: str, epoch: int, spec: JobSpec) -> _EpochTasks:
        if epoch < 0:
            raise CoordinatorError(f"epoch must be >= 0, got {epoch}")
        if (job, epoch) not in self._epochs:
            prefix = f"tasks/{job}/{epoch:08d}/"
            records = {int(key[len(prefix):]): record
                       for key, record in self.store.scan(prefix).items()}
            self._epochs[(job, epoch)] = _EpochTasks(records, spec.num_tasks)
        return self._epochs[(job, epoch)]

    def _task(self, tasks: _EpochTasks, task: int) -> Versioned:
        if task not in tasks.records:
            raise CoordinatorError(f"task {task} was never leased in this epoch")
        return tasks.records[task]

    def _put_task(self, job: str, epoch: int, tasks: _EpochTasks, task: int,
                  value: dict[str, Any]) -> None:
        current = tasks.records.get(task)
        version = self._write(f"tasks/{job}/{epoch:08d}/{task:08d}", value,
                              0 if current is None else current.version, (job, epoch))
        tasks.records[task] = Versioned(value, version)

    def _write(self, key: str, value: dict[str, Any], expected_version: int,
               epoch_key: tuple[str, int] | None = None) -> int:
        try:
            return self.store.put(key, value, expected_version)
        except VersionConflict as error:
            if epoch_key is not None:
                self._epochs.pop(epoch_key, None)
            raise CoordinatorError(f"the coordinator state changed underneath it ({error}); is a "
                                   "second coordinator using the same state?") from None

    def _expiry(self, record: Versioned) -> float:
        return max(record.value["expires_at"], self.started_at + self.lease_ttl)

    def _is_reclaimable(self, record: Versioned, now: float) -> bool:
        state = record.value["state"]
        return state == RELEASED or (state == LEASED and self._expiry(record) <= now)

    def _reclaimable(self, tasks: _EpochTasks, now: float) -> int | None:
        return min((task for task, record in tasks.records.items()
                    if self._is_reclaimable(record, now)), default=None)

    @staticmethod
    def _acked(tasks: _EpochTasks) -> int:
        return sum(1 for record in tasks.records.values() if record.value["state"] == ACKED)


class _Handler(BaseHTTPRequestHandler):
    """POST /v1/METHOD with a JSON object; answers JSON.

    A refused request is 400 with {"error"}; a failure of the state store (etcd unreachable) is
    503, which clients retry, since the store usually comes back.
    """

    coordinator: Coordinator
    methods = {"register", "lease", "renew", "ack", "release", "status", "info"}

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches on
        method = self.path.removeprefix("/v1/")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if method not in self.methods or not isinstance(body, dict):
                raise CoordinatorError(f"unknown request {self.path}")
            self._answer(HTTPStatus.OK, self._dispatch(method, body))
        except (CoordinatorError, TypeError, ValueError, KeyError) as error:
            self._answer(HTTPStatus.BAD_REQUEST, {"error": str(error)})
        except Exception as error:
            log.exception("request %s failed", self.path)
            self._answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"coordinator failed: {error}"})

    def _dispatch(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        coordinator = self.coordinator
        if method == "info":
            return {"lease_ttl": coordinator.lease_ttl}
        if method == "register":
            spec = coordinator.register(body["job"], JobSpec(**body["spec"]))
            return {"spec": asdict(spec), "lease_ttl": coordinator.lease_ttl}
        if method == "lease":
            return coordinator.lease(body["job"], int(body["epoch"]), str(body["worker"]))
        if method == "status":
            return coordinator.status(body["job"], int(body["epoch"]))
        task_args = (body["job"], int(body["epoch"]), int(body["task"]), str(body["token"]))
        if method == "renew":
            return coordinator.renew(*task_args)
        if method == "ack":
            return coordinator.ack(*task_args, samples=int(body["samples"]))
        return coordinator.release(*task_args)

    def _answer(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("%s " + format, self.address_string(), *args)


def make_server(coordinator: Coordinator, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("CoordinatorHandler", (_Handler,), {"coordinator": coordinator})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class CoordinatorClient:
    """A trainer's handle on one job at a coordinator; plain data, so it pickles to workers.

    Connection failures, answers cut off included (a coordinator killed while it replied), are
    retried for `retry_for` seconds, which carries trainers across a coordinator restart.
    Retrying is safe: a repeated ack is answered `duplicate`, and a lease whose answer was lost
    simply expires.
    """

    def __init__(self, url: str, job: str, *, timeout: float = 10.0,
                 retry_for: float = 120.0) -> None:
        if not JOB_NAME.match(job):
            raise ValueError(f"invalid job name {job!r}: use letters, digits, '.', '_', '-'")
        self.url = url.rstrip("/")
        self.job = job
        self.timeout = timeout
        self.retry_for = retry_for

    def register(self, spec: JobSpec) -> float:
        """Registers the job (or checks this trainer agrees with it); returns the lease TTL."""
        return float(self._call("register", spec=asdict(spec))["lease_ttl"])

    def lease_ttl(self) -> float:
        return float(self._call("info")["lease_ttl"])

    def lease(self, epoch: int, worker: str) -> Lease | None:
        answer = self._call("lease", epoch=epoch, worker=worker)
        return None if answer["lease"] is None else Lease(**answer["lease"])

    def renew(self, lease: LeaseRef) -> bool:
        return bool(self._call("renew", **self._task_args(lease))["renewed"])

    def ack(self, lease: LeaseRef, samples: int) -> AckResult:
        return AckResult(self._call("ack", samples=samples, **self._task_args(lease))["result"])

    def release(self, lease: LeaseRef) -> bool:
        return bool(self._call("release", **self._task_args(lease))["released"])

    def status(self, epoch: int) -> dict[str, Any]:
        return self._call("status", epoch=epoch)

    @staticmethod
    def _task_args(lease: LeaseRef) -> dict[str, Any]:
        return {"epoch": lease.epoch, "task": lease.task, "token": lease.token}

    def _call(self, method: str, **body: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/v1/{method}", data=json.dumps({"job": self.job, **body}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                message = json.loads(error.read() or b"{}").get("error", error.reason)
                if error.code != HTTPStatus.SERVICE_UNAVAILABLE:
                    raise CoordinatorError(f"coordinator {self.url}: {message}") from None
                failure: object = message
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                    TimeoutError) as error:
                failure = getattr(error, "reason", error)
            if time.monotonic() + delay > deadline:
                raise CoordinatorUnavailable(
                    f"coordinator {self.url} did not answer for {self.retry_for:.0f}s: {failure}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _serve(args: argparse.Namespace) -> int:
    try:
        store = open_store(args.state)
    except (OSError, ValueError) as error:
        print(f"python -m adapters.sharding serve: error: {error}", file=sys.stderr)
        return 2
    coordinator = Coordinator(store, lease_ttl=args.lease_ttl)
    try:
        server = make_server(coordinator, args.host, args.port)
    except OSError as error:
        print(f"python -m adapters.sharding serve: error: cannot listen on "
              f"{args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):  # stop between requests, never inside one
        signal.signal(signum, lambda *_: threading.Thread(target=server.shutdown).start())
    host, port = server.server_address[:2]
    print(f"adapters.sharding: serving http://{host}:{port} (state {args.state}, "
          f"lease TTL {args.lease_ttl:g}s)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        store.close()
    return 0


def _status(args: argparse.Namespace) -> int:
    client = CoordinatorClient(args.coordinator, args.job, retry_for=args.retry_for)
    try:
        print(json.dumps(client.status(args.epoch), indent=2))
    except (CoordinatorError, CoordinatorUnavailable) as error:
        print(f"python -m adapters.sharding status: error: {error}", file=sys.stderr)
        return 1
    return 0


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.sharding",
                                     description="Elastic data-sharding coordinator.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the coordinator as an HTTP/JSON service")
    serve.add_argument("--state", required=True,
                       help="SQLite state file, or etcd://HOST:PORT[/PREFIX]")
    serve.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; "
                            "0.0.0.0 for trainers on other machines)")
    serve.add_argument("--lease-ttl", type=_positive_seconds, default=DEFAULT_LEASE_TTL,
                       help="seconds a lease lives without renewal (default 60)")
    serve.set_defaults(run=_serve)
    status = commands.add_parser("status", help="print one epoch's progress as JSON")
    status.add_argument("--coordinator", required=True, help="http://HOST:PORT")
    status.add_argument("--job", required=True)
    status.add_argument("--epoch", type=int, default=0)
    status.add_argument("--retry-for", type=float, default=5.0)
    status.set_defaults(run=_status)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
