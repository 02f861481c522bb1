"""Fixtures for gpu_sched: a tiny Kubernetes API server, the extender over real HTTP, object makers.

The fake API server speaks the API's JSON for exactly the calls gpu_sched makes (pods list/get/patch,
pod binding, nodes list/get/patch) and keeps the objects in memory, so tests read outcomes (a pod's
annotations, its nodeName) where a user would: on the API server. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpu_sched.extender import READ_TIMEOUT_SECONDS, Extender, ExtenderHTTPServer
from gpu_sched.kube import KubeClient, api_client
from gpu_sched.policies import make_policy
from gpu_sched.quota import QuotaBook
from gpu_sched.topology import parse_nvidia_smi_topo

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, which is also what a strategic merge does to metadata maps."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeApiServer:
    """Pods and nodes in memory behind the API server's REST paths and JSON shapes."""

    PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.unavailable = False
        """When set, every call gets 503, as from an API server that lost its etcd."""
        self.pod_read_delay = 0.0
        """Seconds a pod read is answered late, with the pod as it was when the read arrived."""
        self.lost_binding_answers = 0
        """How many of the next binding POSTs land but get 409, as a transport's retry of a
        binding whose answer was lost does."""
        self.pod_reads = 0
        self.bindings_landed = 0
        self.lock = threading.Lock()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod["metadata"]
        with self.lock:
            self.pods[(meta.get("namespace", "default"), meta["name"])] = copy.deepcopy(pod)
        return pod

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.nodes[node["metadata"]["name"]] = copy.deepcopy(node)
        return node

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            del self.pods[(namespace, name)]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null")

            def _found(self, item: dict[str, Any] | None, name: str) -> None:
                if item is None:
                    self._reply(404, _status(404, "NotFound", f'"{name}" not found'))
                else:
                    self._reply(200, item)

            def _parts(self) -> list[str]:
                return [p for p in self.path.split("?", 1)[0].split("/") if p]

            def _refused(self) -> bool:
                if api.unavailable:
                    self._body()
                    self._reply(503, _status(503, "ServiceUnavailable", "the server is "
                                             "currently unable to handle the request"))
                return api.unavailable

            def do_GET(self) -> None:
                if self._refused():
                    return
                parts = self._parts()
                with api.lock:
                    if parts == ["api", "v1", "pods"]:
                        items = list(api.pods.values())
                        self._reply(200, {"kind": "PodList", "apiVersion": "v1",
                                          "metadata": {"resourceVersion": "1"}, "items": items})
                    elif parts == ["api", "v1", "nodes"]:
                        self._reply(200, {"kind": "NodeList", "apiVersion": "v1",
                                          "metadata": {"resourceVersion": "1"},
                                          "items": list(api.nodes.values())})
                    elif len(parts) == 6 and parts[4] == "persistentvolumeclaims":
                        self._found(api.claims.get((parts[3], parts[5])), parts[5])
                    elif len(parts) == 4 and parts[2] == "persistentvolumes":
                        self._found(api.volumes.get(parts[3]), parts[3])
                    elif len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] \
                            and parts[4] == "pods":
                        api.pod_reads += 1
                        pod = copy.deepcopy(api.pods.get((parts[3], parts[5])))
                        if api.pod_read_delay:
                            api.lock.release()
                            time.sleep(api.pod_read_delay)
                            api.lock.acquire()
                        if pod is None:
                            self._reply(404, _status(404, "NotFound",
                                                     f'pods "{parts[5]}" not found'))
                        else:
                            self._reply(200, pod)
                    else:
                        self._reply(404, _status(404, "NotFound", "the server could not find "
                                                 "the requested resource"))

            def do_PATCH(self) -> None:
                if self._refused():
                    return
                parts = self._parts()
                content_type = self.headers.get("Content-Type", "").split(";")[0]
                body = self._body()
                if content_type not in FakeApiServer.PATCH_TYPES:
                    self._reply(415, _status(415, "UnsupportedMediaType",
                                             f"the body of the request was in an unknown format"
                                             f" - accepted media types include: "
                                             f"{', '.join(FakeApiServer.PATCH_TYPES)}"))
                    return
                with api.lock:
                    if len(parts) == 6 and parts[4] == "pods":
                        target = api.pods.get((parts[3], parts[5]))
                    elif len(parts) == 4 and parts[2] == "nodes":
                        target = api.nodes.get(parts[3])
                    else:
                        target = None
                    if target is None:
                        self._reply(404, _status(404, "NotFound", f"{parts[-1]} not found"))
                        return
                    _merge(target, body)
                    self._reply(200, target)

            def do_POST(self) -> None:
                if self._refused():
                    return
                parts = self._parts()
                body = self._body()
                if len(parts) != 7 or parts[4] != "pods" or parts[6] != "binding":
                    self._reply(404, _status(404, "NotFound", "no such resource"))
                    return
                with api.lock:
                    pod = api.pods.get((parts[3], parts[5]))
                    if pod is None:
                        self._reply(404, _status(404, "NotFound", f'pods "{parts[5]}" not found'))
                        return
                    uid = (body.get("metadata") or {}).get("uid")
                    if uid and uid != pod["metadata"].get("uid"):
                        self._reply(409, _status(409, "Conflict", "Precondition failed: UID "
                                                 f"in precondition: {uid}, UID in object meta: "
                                                 f"{pod['metadata'].get('uid')}"))
                        return
                    if pod["spec"].get("nodeName"):
                        self._reply(409, _status(409, "Conflict", f"pod {parts[5]} is already "
                                                 f"assigned to node \"{pod['spec']['nodeName']}\""))
                        return
                    pod["spec"]["nodeName"] = body["target"]["name"]
                    pod.setdefault("status", {})["phase"] = "Running"
                    api.bindings_landed += 1
                    if api.lost_binding_answers:
                        api.lost_binding_answers -= 1
                        self._reply(409, _status(409, "Conflict", "Operation cannot be "
                                                  f'fulfilled on pods/binding "{parts[5]}": pod '
                                                  f"{parts[5]} is already assigned to node "
                                                  f'"{pod["spec"]["nodeName"]}"'))
                        return
                    self._reply(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success", "code": 201})

        return Handler


def make_pod(name: str, gpus: int = 0, milli: int = 0, group: str | None = None,
             namespace: str = "default", gpu_spec: str | None = None,
             node: str | None = None, assigned: str | None = None, cpu: str = "4",
             memory: str = "16Gi") -> dict[str, Any]:
    """A pod as the API server returns it, with the GPU ask in its container's limits."""
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if milli:
        limits["gpu-sched/gpu-milli"] = str(milli)
    annotations: dict[str, str] = {}
    if gpu_spec:
        annotations["gpu-sched/gpu-spec"] = gpu_spec
    if assigned is not None:
        annotations["gpu-sched/gpus"] = assigned
    metadata: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        "resourceVersion": "1", "creationTimestamp": "2024-05-01T10:00:00Z",
        "labels": {"app": "train"},
    }
    if group:
        metadata["labels"]["gpu-sched/group"] = group
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                        "resources": {"limits": limits, "requests": dict(limits)},
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
        "schedulerName": "default-scheduler", "priority": 0,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "spec": spec,
            "status": {"phase": "Running" if node else "Pending", "qosClass": "Guaranteed"}}


def make_node(name: str, gpus: int = 8, topology_file: str | None = None,
              model: str | None = "Tesla-V100-SXM2-32GB", cpu: str = "96",
              memory: str = "790000000Ki") -> dict[str, Any]:
    """A node as the API server returns it; topology_file names a fixture under data/."""
    annotations = {"node.alpha.kubernetes.io/ttl": "0",
                   "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
    if topology_file:
        topology = parse_nvidia_smi_topo((DATA / topology_file).read_text())
        annotations["gpu-sched/topology"] = topology.to_annotation()
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if model:
        labels["nvidia.com/gpu.product"] = model
    resources = {"cpu": cpu, "memory": memory, "pods": "110",
                 "nvidia.com/gpu": str(gpus)}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, "node-" + name)),
                     "labels": labels, "annotations": annotations},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"capacity": resources, "allocatable": dict(resources),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "nodeInfo": {"kubeletVersion": "v1.30.2", "containerRuntimeVersion":
                                "containerd://1.7.13", "architecture": "amd64"}},
    }


class HttpClient:
    """Posts raw bytes or JSON to a base URL; returns (status, parsed JSON body)."""

    def __init__(self, base_url: str, extender: Extender | None = None) -> None:
        self.base_url = base_url
        self.extender = extender

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    yield api
    api.stop()


@pytest.fixture
def pod_json() -> Callable[..., dict[str, Any]]:
    return make_pod


@pytest.fixture
def node_json() -> Callable[..., dict[str, Any]]:
    return make_node


@pytest.fixture
def start_extender(fake_api: FakeApiServer) -> Iterator[Callable[..., HttpClient]]:
    """Starts the extender in this process on a free 127.0.0.1 port, after its start-up resync."""
    servers: list[ExtenderHTTPServer] = []

    def start(policy: str = "binpack", quota: QuotaBook | None = None,
              seed: int | None = None, locality_weight: float = 0.3,
              read_timeout: float = READ_TIMEOUT_SECONDS) -> HttpClient:
        extender = Extender(KubeClient(api_client(fake_api.url)), make_policy(policy, seed), quota,
                            locality_weight=locality_weight)
        extender.resync()
        server = ExtenderHTTPServer(("127.0.0.1", 0), extender, read_timeout)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(server)
        return HttpClient(f"http://127.0.0.1:{server.server_address[1]}", extender)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def run_module() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs `python -m MODULE ARGS` from the repository root, as a user would; with
    pythonpath=False, with no PYTHONPATH at all, as from a fresh checkout."""
    def run(module: str, *args: str, timeout: float = 60, pythonpath: bool = True
            ) -> subprocess.CompletedProcess[str]:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        if pythonpath:
            env["PYTHONPATH"] = str(REPO_ROOT)
        return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    return run


@pytest.fixture
def start_extender_process(fake_api: FakeApiServer, tmp_path: Path
                           ) -> Iterator[Callable[..., HttpClient]]:
    """The extender as its command line starts it, in a child process; stopped after the test."""
    processes: list[subprocess.Popen[bytes]] = []
    logs = []

    def start(*extra: str) -> HttpClient:
        port = _free_port()
        log = open(tmp_path / f"extender-{port}.log", "wb")  # noqa: SIM115 - closed at teardown
        logs.append(log)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        process = subprocess.Popen(
            [sys.executable, "-m", "gpu_sched.extender", "--host", "127.0.0.1", "--port",
             str(port), "--kube-api", fake_api.url, *extra],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        client = HttpClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log.flush()
                raise RuntimeError((tmp_path / f"extender-{port}.log").read_text())
            try:
                if client.get("/healthz")[0] == 200:
                    return client
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("extender did not come up in 30 s")

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for log in logs:
        log.close()
