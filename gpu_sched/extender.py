"""kube-scheduler extender: /filter, /prioritize and /bind over HTTP, in kube-scheduler's own JSON.

Run: python -m gpu_sched.extender --port 8888 [--policy fgd] [--quota FILE] [--kube-api URL]

Request and response bodies follow k8s.io/kube-scheduler/extender/v1 exactly (Go field names, no
json tags): ExtenderArgs {Pod, Nodes, NodeNames}; ExtenderFilterResult {Nodes, NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}; a bare list of HostPriority {Host, Score} with
scores 0-10; ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} -> ExtenderBindingResult
{Error}. As with Go's decoder, request field names match case-insensitively.

A body that is not JSON or not of those shapes gets HTTP 400 with a one-line {"Error": ...}, one
over MAX_BODY_BYTES 413 and one that stalls for READ_TIMEOUT_SECONDS 408; a problem with the
cluster (an unknown node, an API server error) is reported inside a normal response, where
kube-scheduler shows it to the pod's owner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest, NodeGpus
from gpu_sched.k8s_objects import (
    GPUS_ANNOTATION,
    NodeInfo,
    ObjectError,
    node_info,
    node_name,
    pod_group,
    pod_key,
    pod_metadata,
    pod_request,
)
from gpu_sched.kube import KubeClient, KubeError, api_client
from gpu_sched.locality import combine, csi_sources, pod_sources
from gpu_sched.placement import Rejection, feasible_nodes, rejection
from gpu_sched.policies import POLICY_NAMES, Policy, make_policy
from gpu_sched.quota import QuotaBook, QuotaError, load_quota
from gpu_sched.state import FINISHED_PHASES, Assignment, Ledger, assignment_from_pod

log = logging.getLogger("gpu_sched.extender")

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body read. kube-scheduler sends the extender only the nodes its own filters
passed, at most its percentageOfNodesToScore sample (adaptive by default: under 800 nodes in
clusters of up to 15,000), so even full node objects (nodeCacheCapable false) stay below this."""
READ_TIMEOUT_SECONDS = 30.0
"""Longest wait for a client's next bytes, within a request or between kept-alive requests, so a
stalled client cannot hold a server thread forever. kube-scheduler's own httpTimeout is shorter."""
MAX_NESTING = 64
"""Deepest JSON nesting accepted; Kubernetes objects stay far shallower, and a limit well below
Python's recursion limit keeps every later step (matching, echoing nodes back) from recursing out."""
UNKNOWN_NODE = "unknown node: the API server lists no node of this name"


class BadRequest(ValueError):
    """A request kube-scheduler would never send; answered with HTTP `status`."""

    status = 400


class BodyTooLarge(BadRequest):
    status = 413


class BodyTimeout(BadRequest):
    status = 408


def _unknown_reason(count: int) -> str:
    """One reason for all the unknown names of a request, reported on the first: a reason per name
    would let a request of made-up names grow the answer by some 60 bytes a name."""
    if count == 1:
        return UNKNOWN_NODE
    return f"{UNKNOWN_NODE} (nor of {count - 1} more names asked about, left out)"


def _field(obj: dict[str, Any], name: str) -> Any:
    """A field by its Go name, matched case-insensitively as encoding/json does."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    return next((value for key, value in obj.items() if key.lower() == lowered), None)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


def _nesting_depth(value: Any) -> int:
    """Depth of nested arrays and objects, walked without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) \
            else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _spec(obj: Any) -> dict[str, Any]:
    """An API object's spec, or an empty one when the object or its spec is not a mapping."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    return spec if isinstance(spec, dict) else {}


def _string(obj: dict[str, Any], name: str, required: bool = True) -> str:
    value = _field(obj, name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadRequest(f"ExtenderBindingArgs.{name} must be a non-empty string")
    return value


class NodeDirectory:
    """GPU inventory by node name, for requests that carry names only (nodeCacheCapable: true).

    Entries come from API server listings and from node objects kube-scheduler sends, and are
    reused for `ttl` seconds. A name that is unknown or stale triggers a relisting, at most once a
    second, so a new node is seen quickly without a listing per request.
    """

    def __init__(self, kube: KubeClient, ttl: float) -> None:
        self._kube = kube
        self._ttl = ttl
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[NodeInfo, float]] = {}
        self._listed_at = float("-inf")

    def remember(self, infos: Iterable[NodeInfo]) -> None:
        now = time.monotonic()
        with self._lock:
            self._nodes.update((info.name, (info, now)) for info in infos)

    def lookup(self, names: Iterable[str]) -> dict[str, NodeInfo]:
        names = list(names)
        with self._lock:
            now = time.monotonic()
            stale = any(name not in self._nodes or now - self._nodes[name][1] > self._ttl
                        for name in names)
            if stale and now - self._listed_at > 1.0:
                self._relist()
            return {name: self._nodes[name][0] for name in names if name in self._nodes}

    def _relist(self) -> None:
        try:
            listed = self._kube.list_nodes()
        except KubeError as exc:
            if not self._nodes:
                raise
            log.warning("%s; using the nodes seen before", exc)
            return
        now = time.monotonic()
        self._listed_at = now
        nodes = {name: entry for name, entry in self._nodes.items() if now - entry[1] <= self._ttl}
        for node in listed:
            try:
                info = node_info(node)
            except ObjectError as exc:
                log.warning("skipping unreadable node: %s", exc)
                continue
            nodes[info.name] = (info, now)
        self._nodes = nodes


@dataclass
class _Evaluation:
    """One pod against the candidate nodes; request is None when the pod's request is invalid."""

    names: list[str]
    node_list: dict[str, Any] | None
    objects: dict[str, Any]
    request: GpuRequest | None = None
    fits: list[NodeGpus] = field(default_factory=list)
    rejected: dict[str, Rejection] = field(default_factory=dict)

    def passing(self) -> set[str]:
        """Names of fitting nodes; a pod wanting no GPU passes everywhere: kube-scheduler has
        checked its CPU and memory, and where it goes best is for /prioritize to say."""
        if self.request is not None and not self.request.wants_gpu:
            return set(self.names)
        return {node.name for node in self.fits}


class Extender:
    """The scheduling decisions behind the three verbs; HTTP-free so each is one method call."""

    def __init__(self, kube: KubeClient, policy: Policy, quota: QuotaBook | None = None,
                 node_cache_seconds: float = 10.0, locality_weight: float = 0.3) -> None:
        self.kube = kube
        self.policy = policy
        self.quota = quota
        self.locality_weight = locality_weight
        self.ledger = Ledger()
        self.nodes = NodeDirectory(kube, node_cache_seconds)

    def resync(self) -> int:
        """Rebuild the ledger from the bound pods' requests and gpu-sched/gpus annotations, and
        teach the policy every unfinished pod listed, bound or pending; returns how many pods
        hold GPUs.

        The pending pods are why the listing teaches the policy: a pod for which
        kube-scheduler's own filters leave no node never reaches /filter or /prioritize, so the
        pod mix would under-count the pods that stop fitting once the cluster fills. The bound
        ones give a restarted extender the mix of the pods already running.
        """
        started = time.monotonic()
        pods = self.kube.list_pods()
        listed = [a for a in (assignment_from_pod(pod) for pod in pods) if a is not None]
        self.ledger.replace(listed, started)
        for pod in pods:
            status = pod.get("status")
            if isinstance(status, dict) and status.get("phase") in FINISHED_PHASES:
                continue
            try:
                self._learn(pod, pod_request(pod))
            except ObjectError as exc:
                log.debug("resync: not learning a pod: %s", exc)
        return sum(1 for a in listed if a.gpus)

    def _learn(self, pod: dict[str, Any], request: GpuRequest) -> None:
        """Tell the policy of the pod, once per pod (its UID, else its key), when it asks for
        what the shipped scheduler configuration sends the extender: GPUs, CPU or memory."""
        if not (request.wants_gpu or request.cpu or request.memory):
            return
        key = pod_key(pod)
        uid = pod_metadata(pod).get("uid")
        self.policy.learn(uid if isinstance(uid, str) and uid else key, request)

    def _quota_refusal(self, pod: dict[str, Any], request: GpuRequest) -> str | None:
        if self.quota is None:
            return None
        key = pod_key(pod)
        return self.quota.refusal(pod_group(pod), request.gpu_equivalent,
                                  lambda group: self.ledger.group_usage(self.quota, group, key))

    def _candidates(self, args: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any],
                                                          dict[str, Any] | None]:
        """Pod, node names in request order, node objects by name (Nodes mode) and the NodeList."""
        pod = _object(_field(args, "Pod"), "ExtenderArgs.Pod")
        try:
            pod_key(pod)
            pod_group(pod)
        except ObjectError as exc:
            raise BadRequest(f"ExtenderArgs.Pod: {exc}") from exc
        names_value = _field(args, "NodeNames")
        nodes_value = _field(args, "Nodes")
        if names_value is not None:
            if not isinstance(names_value, list) or not all(isinstance(n, str) for n in names_value):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
            return pod, names_value, {}, None
        if nodes_value is None:
            raise BadRequest("ExtenderArgs needs Nodes or NodeNames")
        node_list = _object(nodes_value, "ExtenderArgs.Nodes")
        items = _field(node_list, "items")
        items = [] if items is None else items
        if not isinstance(items, list):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list")
        objects: dict[str, Any] = {}
        for index, item in enumerate(items):
            try:
                objects[node_name(item)] = item
            except ObjectError as exc:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{index}]: {exc}") from exc
        return pod, list(objects), objects, node_list

    def _evaluate(self, args: dict[str, Any], scoring: bool = False) -> _Evaluation:
        """Everything filter and prioritize share: which nodes fit, and why the others do not.

        A CPU-only pod fits every node it is asked about (kube-scheduler checked its CPU and
        memory); only for scoring are the known ones worked out, with the CPU, memory and GPUs
        the ledger leaves them, as the simulator places such pods on GPU machines.
        """
        pod, names, objects, node_list = self._candidates(args)
        evaluation = _Evaluation(names, node_list, objects)
        try:
            evaluation.request = pod_request(pod)
        except ObjectError as exc:
            reason = Rejection(f"invalid GPU request: {exc}", True)
            evaluation.rejected = {name: reason for name in names}
            return evaluation
        request = evaluation.request
        self._learn(pod, request)
        if not request.wants_gpu and not scoring:
            return evaluation
        rejected = evaluation.rejected
        if node_list is None:
            infos = self.nodes.lookup(names)
        else:
            infos = {}
            for name, obj in objects.items():
                try:
                    infos[name] = node_info(obj)
                except ObjectError as exc:
                    rejected[name] = Rejection(f"unreadable node: {exc}", True)
            self.nodes.remember(infos.values())
        unknown = [name for name in names if name not in infos and name not in rejected]
        if unknown:
            rejected[unknown[0]] = Rejection(_unknown_reason(len(unknown)), False)
        key = pod_key(pod)
        states = [self.ledger.node_gpus(infos[name], exclude_pod=key)
                  for name in names if name in infos]
        if not request.wants_gpu:
            evaluation.fits = states
            return evaluation
        refusal = self._quota_refusal(pod, request)
        if refusal:
            rejected.update((name, Rejection(refusal, True)) for name in infos)
            return evaluation
        evaluation.fits, unfit = feasible_nodes(request, states)
        rejected.update(unfit)
        return evaluation

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            evaluation = self._evaluate(args)
        except KubeError as exc:
            return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                    "FailedAndUnresolvableNodes": {}, "Error": str(exc)}
        rejected = evaluation.rejected
        passing_names = evaluation.passing()
        passing = [name for name in evaluation.names if name in passing_names]
        result: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {n: r.reason for n, r in rejected.items() if not r.unresolvable},
            "FailedAndUnresolvableNodes": {n: r.reason for n, r in rejected.items()
                                           if r.unresolvable},
            "Error": "",
        }
        if evaluation.node_list is None:
            result["NodeNames"] = passing
        else:
            result["Nodes"] = {**evaluation.node_list,
                               "items": [evaluation.objects[name] for name in passing]}
        return result

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            evaluation = self._evaluate(args, scoring=True)
        except KubeError as exc:
            log.warning("prioritize: %s; scoring every node 0", exc)
            return [{"Host": name, "Score": 0} for name in self._candidates(args)[1]]
        request = evaluation.request
        scores: dict[str, int] = {}
        if request is not None and evaluation.fits:
            scores = self.policy.scores(request, evaluation.fits)
            if self.locality_weight:
                scores = self._with_locality(_object(_field(args, "Pod"), "ExtenderArgs.Pod"),
                                             evaluation.fits, scores)
        return [{"Host": name, "Score": scores.get(name, 0)} for name in evaluation.names]

    def _with_locality(self, pod: dict[str, Any], fits: list[NodeGpus],
                       scores: dict[str, int]) -> dict[str, int]:
        """GPU scores mixed with how much of the pod's avafs data each fitting node caches."""
        try:
            sources = pod_sources(pod, self._claim_sources)
        except KubeError as exc:
            log.warning("prioritize: %s; scoring without data locality", exc)
            return scores
        if not sources:
            return scores
        infos = self.nodes.lookup(node.name for node in fits)
        held = {name: sum(info.cached.get(source, 0) for source in sources)
                for name, info in infos.items()}
        return combine(scores, held, self.locality_weight)

    def _claim_sources(self, namespace: str, claim: str) -> list[str]:
        volume = _spec(self.kube.get_pvc(namespace, claim)).get("volumeName")
        if not isinstance(volume, str) or not volume:
            return []
        return csi_sources(_spec(self.kube.get_pv(volume)).get("csi"))

    def bind(self, args: dict[str, Any]) -> dict[str, str]:
        name = _string(args, "PodName")
        namespace = _string(args, "PodNamespace")
        uid = _string(args, "PodUID", required=False)
        node = _string(args, "Node")
        try:
            self._bind(namespace, name, uid, node)
        except (KubeError, ObjectError) as exc:
            log.warning("bind %s/%s to %s: %s", namespace, name, node, exc)
            return {"Error": str(exc)}
        return {"Error": ""}

    def _bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind one pod; a pod already bound, by the API server's word or the ledger's, is never
        re-placed, and GPUs are released only when the API server shows the pod unbound.

        A retried bind (kube-scheduler's request timed out after the first one went through) must
        leave the running pod's ledger entry and annotation alone: re-placing it would record
        GPUs for it afresh, and the API server's refusal would then release the GPUs it holds.
        Its read of the pod may predate the first bind even when it is answered after the first
        bind settled (a slow API server), so a settled ledger entry for the same pod counts as
        bound too: settled entries are made only once the API server has shown the binding.
        """
        pod = self.kube.get_pod(namespace, name)
        actual_uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid and actual_uid and uid != actual_uid:
            raise ObjectError(f"pod {namespace}/{name} is now UID {actual_uid}, not {uid}")
        uid = uid or actual_uid
        key = pod_key(pod)
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            self._adopt(pod, key, uid, node)
            return
        request = pod_request(pod)
        info = None
        if request.wants_gpu:
            info = self.nodes.lookup([node]).get(node)
            if info is None:
                raise ObjectError(f"node {node}: {UNKNOWN_NODE}")
        with self.ledger.lock:
            if self._bound_in_ledger(key, uid, node):
                return
            placement = None
            if info is not None:
                refusal = self._quota_refusal(pod, request)
                if refusal:
                    raise ObjectError(refusal)
                state = self.ledger.node_gpus(info, exclude_pod=key)
                why = rejection(state, request)
                placement = self.policy.place(state, request) if why is None else None
                if placement is None:
                    raise ObjectError(f"node {node}: {why.reason if why else 'no GPUs fit'}")
            milli_each = request.milli if request.is_shared else MILLI_PER_GPU
            assignment = Assignment(key, uid, node, placement.gpus if placement else (),
                                    milli_each if placement else 0, pod_group(pod),
                                    request.gpu_equivalent, cpu=request.cpu,
                                    memory=request.memory)
            self.ledger.record(assignment)
        try:
            if placement is not None:
                self.kube.annotate_pod(namespace, name, {GPUS_ANNOTATION: placement.annotation})
            self.kube.bind_pod(namespace, name, uid, node)
        except KubeError as exc:
            if not self._landed(namespace, name, uid, node, assignment):
                self.ledger.release(key, only=assignment)
                raise
            log.warning("bind %s to %s: %s, yet the pod is bound there; keeping its GPUs",
                        key, node, exc)
            return
        except BaseException:
            self.ledger.release(key, only=assignment)
            raise
        with self.ledger.lock:
            if self.ledger.get(key) is assignment:
                self.ledger.record(replace(assignment, settled_at=time.monotonic()))
        log.info("bound %s to %s, GPUs %s", key, node,
                 placement.annotation if placement else "none")

    def _bound_in_ledger(self, key: str, uid: str, node: str) -> bool:
        """True when the ledger holds the pod as bound to `node`; raises when it holds it as bound
        elsewhere or as being bound. Caller holds the ledger's lock."""
        held = self.ledger.get(key)
        if held is None or (uid and held.uid and held.uid != uid):
            return False
        if held.settled_at is None:
            raise ObjectError(f"pod {key} is being bound to node {held.node} already")
        if held.node != node:
            raise ObjectError(f"pod {key} is already bound to node {held.node}")
        log.info("bind %s to %s: the ledger holds it bound there already", key, node)
        return True

    def _adopt(self, pod: dict[str, Any], key: str, uid: str, node: str) -> None:
        """A pod the API server shows bound: success for its node, an error for another; the
        ledger learns what it holds (its annotation, its CPU and memory) if it lacked the pod."""
        bound_to = pod["spec"]["nodeName"]
        if bound_to != node:
            raise ObjectError(f"pod {key} is already bound to node {bound_to}")
        log.info("bind %s to %s: already bound there", key, node)
        held = assignment_from_pod(pod)
        with self.ledger.lock:
            current = self.ledger.get(key)
            if held is not None and (current is None or (current.uid and current.uid != uid)):
                self.ledger.record(held)

    def _landed(self, namespace: str, name: str, uid: str, node: str,
                assignment: Assignment) -> bool:
        """After a failed bind call: whether the API server shows the pod bound to `node` (its
        answer lost, or a 409 for a binding that went through); if so the ledger keeps the pod,
        settled, with the GPUs its annotation names (ours when it names none)."""
        try:
            pod = self.kube.get_pod(namespace, name)
        except KubeError as exc:
            log.warning("bind %s: cannot tell whether it landed: %s", assignment.pod_key, exc)
            return False
        actual_uid = str((pod.get("metadata") or {}).get("uid") or "")
        if (pod.get("spec") or {}).get("nodeName") != node or (uid and actual_uid != uid):
            return False
        held = assignment_from_pod(pod)
        if held is None or (assignment.gpus and not held.gpus):
            held = replace(assignment, settled_at=time.monotonic())
        with self.ledger.lock:
            if self.ledger.get(assignment.pod_key) is assignment:
                self.ledger.record(held)
        return True


class ExtenderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], extender: Extender,
                 read_timeout: float = READ_TIMEOUT_SECONDS) -> None:
        super().__init__(address, _Handler)
        self.extender = extender
        self.read_timeout = read_timeout


class _Handler(BaseHTTPRequestHandler):
    server: ExtenderHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.read_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _read_json(self) -> Any:
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.close_connection = True
            raise BadRequest("a Content-Length header is required")
        if not (length_text.isascii() and length_text.isdigit()):
            self.close_connection = True
            raise BadRequest(f"Content-Length must be a decimal byte count, got {length_text!r}")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BodyTooLarge(f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit")
        try:
            raw = self.rfile.read(length)
        except TimeoutError as exc:
            self.close_connection = True
            raise BodyTimeout(f"no body bytes for {self.timeout} s") from exc
        if len(raw) < length:
            self.close_connection = True
            raise BadRequest(f"body ended after {len(raw)} of {length} bytes")
        try:
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise BadRequest("body is not UTF-8") from exc
        except json.JSONDecodeError as exc:
            raise BadRequest(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                             ) from exc
        except RecursionError as exc:
            raise BadRequest(f"JSON nested deeper than {MAX_NESTING} levels") from exc
        except ValueError as exc:
            raise BadRequest(f"unreadable JSON value: {str(exc).splitlines()[0]}") from exc
        if _nesting_depth(body) > MAX_NESTING:
            raise BadRequest(f"JSON nested deeper than {MAX_NESTING} levels")
        return body

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"Error": f"no such path {self.path}"})

    def do_POST(self) -> None:
        extender = self.server.extender
        routes: dict[str, Callable[[dict[str, Any]], Any]] = {
            "/filter": extender.filter,
            "/prioritize": extender.prioritize,
            "/bind": extender.bind,
        }
        route = routes.get(self.path.split("?", 1)[0])
        try:
            body = self._read_json()
            if route is None:
                self._send(404, {"Error": f"no such path {self.path}"})
                return
            self._send(200, route(_object(body, "request body")))
        except BadRequest as exc:
            self._send(exc.status, {"Error": str(exc)})
        except Exception as exc:
            log.exception("%s failed", self.path)
            self._send(500, {"Error": f"internal error: {type(exc).__name__}: {exc}"})


def resync_forever(extender: Extender, interval: float, stop: threading.Event) -> None:
    """Periodic relisting, so GPUs of deleted or finished pods go back to the pool."""
    while not stop.wait(interval):
        try:
            extender.resync()
        except KubeError as exc:
            log.warning("resync: %s", exc)


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_sched.extender", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=_port, required=True)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="fgd")
    parser.add_argument("--seed", type=int, help="seed for --policy random")
    parser.add_argument("--quota", help="quota YAML file (see gpu_sched/README.md)")
    parser.add_argument("--kube-api", help="API server URL; default: in-cluster, then kubeconfig")
    parser.add_argument("--node-cache-seconds", type=_positive, default=10.0)
    parser.add_argument("--resync-seconds", type=_positive, default=30.0)
    parser.add_argument("--locality-weight", type=_share, default=0.3,
                        help="0-1: weight of avafs data locality against the GPU score in "
                             "/prioritize (default 0.3; 0 turns it off)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        quota = load_quota(args.quota) if args.quota else None
        extender = Extender(KubeClient(api_client(args.kube_api)),
                            make_policy(args.policy, args.seed), quota, args.node_cache_seconds,
                            args.locality_weight)
        held = extender.resync()
        server = ExtenderHTTPServer((args.host, args.port), extender)
    except (QuotaError, KubeError, OSError) as exc:
        print(f"gpu_sched.extender: {exc}", file=sys.stderr)
        return 1
    log.info("rebuilt GPU assignments of %d pods; policy %s; listening on %s:%d", held,
             args.policy, args.host, server.server_address[1])
    stop = threading.Event()
    threading.Thread(target=resync_forever, args=(extender, args.resync_seconds, stop),
                     daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        stop.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
