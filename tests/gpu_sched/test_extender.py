"""The extender over real HTTP, with kube-scheduler's request bodies and a local API server."""

from __future__ import annotations

import copy
import http.client
import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpu_sched.extender import MAX_BODY_BYTES

DATA = Path(__file__).resolve().parent / "data"


def captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def bind_args(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}


@pytest.fixture
def cluster(fake_api: Any) -> Any:
    """The nodes of the captured kube-scheduler bodies, registered at the API server."""
    for node in captured("filter_args_nodes.json")["Nodes"]["items"]:
        fake_api.add_node(node)
    return fake_api


def test_filter_with_node_names_reports_unknown_nodes(cluster: Any,
                                                      start_extender: Callable[..., Any]) -> None:
    status, result = start_extender().post("/filter", captured("filter_args_names.json"))
    assert status == 200
    assert result == {
        "Nodes": None,
        "NodeNames": ["gpu-a", "gpu-b"],
        "FailedNodes": {"gpu-gone": "unknown node: the API server lists no node of this name"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_with_full_nodes_returns_the_fitting_node_objects(
        cluster: Any, start_extender: Callable[..., Any]) -> None:
    args = captured("filter_args_nodes.json")
    status, result = start_extender().post("/filter", args)
    assert status == 200
    assert result["NodeNames"] is None and result["Error"] == ""
    assert result["Nodes"]["items"] == args["Nodes"]["items"][:2]
    assert result["FailedAndUnresolvableNodes"] == {"cpu-only": "node has no GPUs"}


def test_full_nodes_mode_needs_no_api_server_node_listing(
        fake_api: Any, start_extender: Callable[..., Any]) -> None:
    """With nodeCacheCapable false the request carries the nodes; none are registered here."""
    client = start_extender()
    status, result = client.post("/filter", captured("filter_args_nodes.json"))
    assert status == 200 and [n["metadata"]["name"] for n in result["Nodes"]["items"]] == [
        "gpu-a", "gpu-b"]
    pod = fake_api.add_pod(captured("filter_args_nodes.json")["Pod"])
    assert client.post("/bind", bind_args(pod, "gpu-a"))[1] == {"Error": ""}


def test_prioritize_packs_next_to_running_jobs(cluster: Any, pod_json: Callable[..., dict],
                                               start_extender: Callable[..., Any]) -> None:
    cluster.add_pod(pod_json("running", gpus=2, node="gpu-b", assigned="0,1"))
    args = captured("filter_args_names.json")
    status, result = start_extender().post("/prioritize", args)
    assert status == 200
    assert [entry["Host"] for entry in result] == ["gpu-a", "gpu-b", "gpu-gone"]
    scores = {entry["Host"]: entry["Score"] for entry in result}
    assert scores["gpu-b"] == 10 and scores["gpu-a"] < 10 and scores["gpu-gone"] == 0
    assert all(isinstance(entry["Score"], int) and 0 <= entry["Score"] <= 10 for entry in result)

    status, spread = start_extender(policy="spread").post("/prioritize", args)
    assert {e["Host"]: e["Score"] for e in spread}["gpu-a"] == 10


def test_fgd_prioritize_keeps_room_for_the_shares_it_has_seen(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """After 500-shares, a 400-share: best fit takes the GPU with 600 left (leaving 200, too
    little for a 500-share); fgd takes the one with 900 left, and both GPUs still fit one."""
    fake_api.add_node(node_json("six", gpus=1))
    fake_api.add_node(node_json("nine", gpus=1))
    fake_api.add_pod(pod_json("on-six", milli=400, node="six", assigned="0"))
    fake_api.add_pod(pod_json("on-nine", milli=100, node="nine", assigned="0"))
    names = ["six", "nine"]
    fgd, binpack = start_extender(policy="fgd"), start_extender()
    for index in range(5):
        fgd.post("/prioritize", {"Pod": pod_json(f"half-{index}", milli=500), "NodeNames": names})
    pod = fake_api.add_pod(pod_json("small", milli=400))

    def best(client: Any) -> str:
        scores = client.post("/prioritize", {"Pod": pod, "NodeNames": names})[1]
        assert all(0 <= entry["Score"] <= 10 for entry in scores)
        return max(scores, key=lambda entry: entry["Score"])["Host"]

    assert (best(fgd), best(binpack)) == ("nine", "six")
    assert fgd.post("/bind", bind_args(pod, "nine"))[1] == {"Error": ""}
    assert fake_api.pod("default", "small")["metadata"]["annotations"]["gpu-sched/gpus"] == "0"


def test_ava_packing_keeps_the_eight_gpu_node_free(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """Two 8-GPU machines, 2 GPUs busy on the first; a 2-GPU job, then an 8-GPU job."""
    fake_api.add_node(node_json("first", topology_file="topo_pcie_2socket_8gpu.txt"))
    fake_api.add_node(node_json("second", topology_file="topo_pcie_2socket_8gpu.txt"))
    fake_api.add_pod(pod_json("old", gpus=2, node="first", assigned="0,1"))
    client = start_extender()
    names = ["first", "second"]
    two = fake_api.add_pod(pod_json("two", gpus=2))
    scores = client.post("/prioritize", {"Pod": two, "NodeNames": names})[1]
    best = max(scores, key=lambda entry: entry["Score"])["Host"]
    assert best == "first"
    assert client.post("/bind", bind_args(two, best))[1] == {"Error": ""}
    assert fake_api.pod("default", "two")["metadata"]["annotations"]["gpu-sched/gpus"] == "2,3"

    eight = fake_api.add_pod(pod_json("eight", gpus=8))
    result = client.post("/filter", {"Pod": eight, "NodeNames": names})[1]
    assert result["NodeNames"] == ["second"]
    assert result["FailedNodes"] == {"first": "only 4 of 8 GPUs free, pod asks 8"}


def test_bind_writes_the_annotation_and_creates_the_binding(
        cluster: Any, start_extender: Callable[..., Any]) -> None:
    pod = cluster.add_pod(captured("filter_args_names.json")["Pod"])
    client = start_extender()
    status, result = client.post("/bind", captured("bind_args.json"))
    assert (status, result) == (200, {"Error": ""})
    stored = cluster.pod("ml", "resnet-train-0")
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert stored["metadata"]["annotations"]["gpu-sched/gpus"] == "0,1"
    assert stored["metadata"]["labels"] == pod["metadata"]["labels"]

    again = copy.deepcopy(pod)
    again["metadata"]["name"] = "resnet-train-1"
    again["metadata"]["uid"] = "another-uid"
    cluster.add_pod(again)
    assert client.post("/bind", bind_args(again, "gpu-a"))[1] == {"Error": ""}
    second = cluster.pod("ml", "resnet-train-1")["metadata"]["annotations"]["gpu-sched/gpus"]
    assert second == "2,3"


def test_bind_refuses_stale_uid_unknown_node_and_full_node(
        cluster: Any, pod_json: Callable[..., dict], start_extender: Callable[..., Any]) -> None:
    client = start_extender()
    pod = cluster.add_pod(pod_json("job", gpus=4))
    stale = {**bind_args(pod, "gpu-a"), "PodUID": "0000-old"}
    result = client.post("/bind", stale)[1]
    assert "is now UID" in result["Error"]
    result = client.post("/bind", bind_args(pod, "gpu-gone"))[1]
    assert result["Error"] == "node gpu-gone: unknown node: the API server lists no node of this name"
    cluster.add_pod(pod_json("hog", gpus=6, node="gpu-a", assigned="0,1,2,3,4,5"))
    client.extender.resync()
    result = client.post("/bind", bind_args(pod, "gpu-a"))[1]
    assert result["Error"] == "node gpu-a: only 2 of 8 GPUs free, pod asks 4"
    missing = client.post("/bind", {"PodName": "nope", "PodNamespace": "default", "PodUID": "",
                                    "Node": "gpu-a"})[1]
    assert missing["Error"].startswith("reading pod default/nope failed: HTTP 404")
    assert "gpu-sched/gpus" not in cluster.pod("default", "job")["metadata"].get("annotations", {})
    assert "nodeName" not in cluster.pod("default", "job")["spec"]


def test_concurrent_binds_never_share_a_gpu(fake_api: Any, pod_json: Callable[..., dict],
                                            node_json: Callable[..., dict],
                                            start_extender: Callable[..., Any]) -> None:
    fake_api.add_node(node_json("only", gpus=8))
    pods = [fake_api.add_pod(pod_json(f"p{i}", gpus=1)) for i in range(12)]
    client = start_extender()
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda pod: client.post("/bind", bind_args(pod, "only"))[1], pods))
    assert sum(r["Error"] == "" for r in results) == 8
    assert all(r["Error"] == "node only: only 0 of 8 GPUs free, pod asks 1"
               for r in results if r["Error"])
    taken = [fake_api.pod("default", p["metadata"]["name"])["metadata"].get("annotations", {})
             .get("gpu-sched/gpus") for p in pods]
    assigned = [gpu for gpu in taken if gpu is not None]
    assert sorted(assigned) == [str(i) for i in range(8)]


def test_retried_bind_never_hands_out_a_running_pods_gpus(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """The same bind twice (a kube-scheduler retry), then to another node, then a second pod."""
    fake_api.add_node(node_json("one", gpus=8))
    fake_api.add_node(node_json("two", gpus=8))
    first = fake_api.add_pod(pod_json("first", gpus=8))
    client = start_extender()
    assert client.post("/bind", bind_args(first, "one")) == (200, {"Error": ""})
    assert client.post("/bind", bind_args(first, "one")) == (200, {"Error": ""})
    status, result = client.post("/bind", bind_args(first, "two"))
    assert (status, result) == (200, {"Error": "pod default/first is already bound to node one"})
    stored = fake_api.pod("default", "first")
    assert stored["spec"]["nodeName"] == "one"
    assert stored["metadata"]["annotations"]["gpu-sched/gpus"] == "0,1,2,3,4,5,6,7"

    second = fake_api.add_pod(pod_json("second", gpus=1))
    result = client.post("/filter", {"Pod": second, "NodeNames": ["one", "two"]})[1]
    assert result["NodeNames"] == ["two"]
    assert client.post("/bind", bind_args(second, "one"))[1] == {
        "Error": "node one: only 0 of 8 GPUs free, pod asks 1"}
    assert "gpu-sched/gpus" not in fake_api.pod("default", "second")["metadata"].get(
        "annotations", {})


def test_gpu_sharing_pods_land_on_one_gpu(fake_api: Any, pod_json: Callable[..., dict],
                                          node_json: Callable[..., dict],
                                          start_extender: Callable[..., Any]) -> None:
    fake_api.add_node(node_json("n", gpus=4))
    client = start_extender()
    gpus = []
    for name, milli in (("s1", 300), ("s2", 500), ("s3", 200)):
        pod = fake_api.add_pod(pod_json(name, milli=milli))
        assert client.post("/bind", bind_args(pod, "n"))[1] == {"Error": ""}
        gpus.append(fake_api.pod("default", name)["metadata"]["annotations"]["gpu-sched/gpus"])
    assert len(set(gpus)) == 1
    full = fake_api.add_pod(pod_json("s4", milli=100))
    assert client.post("/bind", bind_args(full, "n"))[1] == {"Error": ""}
    fourth = fake_api.pod("default", "s4")["metadata"]["annotations"]["gpu-sched/gpus"]
    assert fourth != gpus[0]
    whole = fake_api.add_pod(pod_json("w", gpus=3))
    result = client.post("/filter", {"Pod": whole, "NodeNames": ["n"]})[1]
    assert result["FailedNodes"] == {"n": "only 2 of 4 GPUs free, pod asks 3"}


def test_cpu_only_pods_pass_everywhere_and_are_placed_by_the_policy(
        cluster: Any, pod_json: Callable[..., dict], start_extender: Callable[..., Any]) -> None:
    """As the simulator places them: binpack sends a CPU-only pod where the fewest whole GPUs
    stay free, so a machine without GPUs first, then the GPU machine already in use."""
    cluster.add_pod(pod_json("running", gpus=2, node="gpu-b", assigned="0,1"))
    client = start_extender()
    pod = cluster.add_pod(pod_json("web"))
    result = client.post("/filter", {"Pod": pod, "NodeNames": ["gpu-a", "cpu-only", "x"]})[1]
    assert result["NodeNames"] == ["gpu-a", "cpu-only", "x"]
    scores = client.post("/prioritize", {"Pod": pod,
                                         "NodeNames": ["gpu-a", "gpu-b", "cpu-only", "x"]})[1]
    assert [entry["Host"] for entry in scores] == ["gpu-a", "gpu-b", "cpu-only", "x"]
    by_host = {entry["Host"]: entry["Score"] for entry in scores}
    assert by_host["cpu-only"] == 10 and by_host["gpu-b"] > by_host["gpu-a"]
    assert by_host["x"] == 0
    scores = client.post("/prioritize", {"Pod": pod, "NodeNames": ["gpu-a", "gpu-b"]})[1]
    assert max(scores, key=lambda entry: entry["Score"]) == {"Host": "gpu-b", "Score": 10}
    assert client.post("/bind", bind_args(pod, "gpu-b"))[1] == {"Error": ""}
    stored = cluster.pod("default", "web")
    assert stored["spec"]["nodeName"] == "gpu-b"
    assert "gpu-sched/gpus" not in stored["metadata"].get("annotations", {})


def test_model_constraint_and_invalid_requests_are_unresolvable(
        cluster: Any, pod_json: Callable[..., dict], start_extender: Callable[..., Any]) -> None:
    client = start_extender()
    v100 = pod_json("v100-only", gpus=1, gpu_spec="V100M16|V100M32")
    result = client.post("/filter", {"Pod": v100, "NodeNames": ["gpu-a"]})[1]
    assert result["FailedAndUnresolvableNodes"] == {
        "gpu-a": "GPU model Tesla-T4 is not one of V100M16|V100M32"}
    both = pod_json("both", gpus=1)
    both["spec"]["containers"][0]["resources"]["requests"]["gpu-sched/gpu-milli"] = "200"
    result = client.post("/filter", {"Pod": both, "NodeNames": ["gpu-a"]})[1]
    assert result["FailedAndUnresolvableNodes"]["gpu-a"].startswith(
        "invalid GPU request: ask for whole GPUs or a share of one GPU, not both")
    fractional = pod_json("fractional")
    fractional["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"
    result = client.post("/filter", {"Pod": fractional, "NodeNames": ["gpu-a"]})[1]
    assert "nvidia.com/gpu must be a whole number, got '1.5'" in (
        result["FailedAndUnresolvableNodes"]["gpu-a"])


@pytest.mark.parametrize("path, body, message", [
    ("/filter", b"{not json", "malformed JSON: Expecting property name enclosed in double quotes"),
    ("/filter", b"\xff\xfe", "body is not UTF-8"),
    ("/filter", b"[1, 2]", "request body must be a JSON object"),
    ("/filter", b"{}", "ExtenderArgs.Pod must be a JSON object"),
    ("/filter", b'{"Pod": {"metadata": {}}, "NodeNames": ["a"]}', "ExtenderArgs.Pod: pod has no"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p"}}}', "ExtenderArgs needs Nodes or NodeNames"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p", "labels": ["x"]}}, "NodeNames": []}',
     "ExtenderArgs.Pod: pod labels must be an object"),
    ("/prioritize", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "a"}',
     "ExtenderArgs.NodeNames must be a list of strings"),
    ("/prioritize", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": {}}}',
     "ExtenderArgs.Nodes.items must be a list"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"spec": {}}]}}',
     "ExtenderArgs.Nodes.items[0]: node has no metadata.name"),
    ("/bind", b'{"PodName": "p", "PodNamespace": "default"}',
     "ExtenderBindingArgs.Node must be a non-empty string"),
    ("/bind", b'{"PodName": 3, "PodNamespace": "default", "Node": "n"}',
     "ExtenderBindingArgs.PodName must be a non-empty string"),
    ("/filter", b"[" * 100_000 + b"]" * 100_000, "JSON nested deeper than 64 levels"),
    ("/prioritize", b'{"Pod": ' * 5000 + b"1" + b"}" * 5000, "JSON nested deeper than 64 levels"),
    ("/filter", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": '
     + b'{"name": "n", "labels": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}}]}}",
     "JSON nested deeper than 64 levels"),
    ("/bind", b'{"PodName": ' + b"9" * 5000 + b"}", "unreadable JSON value: Exceeds the limit"),
])
def test_malformed_bodies_get_400_with_one_line(path: str, body: bytes, message: str,
                                                cluster: Any,
                                                start_extender: Callable[..., Any]) -> None:
    status, result = start_extender().post(path, body)
    assert status == 400
    assert result["Error"].startswith(message)
    assert "\n" not in result["Error"]


def test_missing_content_length_and_unknown_paths(cluster: Any,
                                                  start_extender: Callable[..., Any]) -> None:
    client = start_extender()
    host, port = client.base_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/filter")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 400
    assert json.loads(response.read()) == {"Error": "a Content-Length header is required"}
    connection.close()
    assert client.post("/preempt", {})[0] == 404
    assert client.get("/healthz") == (200, {"status": "ok"})


def _raw_post(client: Any, length: str, body: bytes = b"") -> tuple[int, dict[str, Any], str]:
    """A POST /filter with the Content-Length header as given: status, body, Connection header."""
    host, port = client.base_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/filter")
    connection.putheader("Content-Length", length)
    connection.endheaders(body)
    response = connection.getresponse()
    answer = (response.status, json.loads(response.read()), response.getheader("Connection", ""))
    connection.close()
    return answer


@pytest.mark.parametrize("length", ["\u00b2", "-5", "0x10", "12, 12", ""])
def test_a_bad_content_length_gets_400(length: str, cluster: Any,
                                       start_extender: Callable[..., Any]) -> None:
    status, result, connection = _raw_post(start_extender(), length, b"{}")
    assert status == 400 and connection == "close"
    assert result["Error"].startswith("Content-Length must be a decimal byte count")


def test_a_body_over_the_limit_gets_413_unread(cluster: Any,
                                               start_extender: Callable[..., Any]) -> None:
    client = start_extender()
    status, result, connection = _raw_post(client, str(MAX_BODY_BYTES + 1))
    assert (status, connection) == (413, "close")
    assert result == {"Error": f"body of {MAX_BODY_BYTES + 1} bytes is over the "
                               f"{MAX_BODY_BYTES}-byte limit"}
    assert client.get("/healthz") == (200, {"status": "ok"})


def test_a_stalled_client_is_answered_408_and_an_idle_one_dropped(
        cluster: Any, start_extender: Callable[..., Any]) -> None:
    client = start_extender(read_timeout=0.5)
    host, port = client.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as stalled:
        stalled.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        answer = b""
        while chunk := stalled.recv(4096):
            answer += chunk
        assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"Error": "no body bytes for 0.5 s"}')
    with socket.create_connection((host, int(port)), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(4096) == b""
        assert time.monotonic() - started < 5
    assert client.get("/healthz") == (200, {"status": "ok"})


def test_unknown_node_names_get_one_reason(cluster: Any,
                                           start_extender: Callable[..., Any]) -> None:
    args = captured("filter_args_names.json")
    args["NodeNames"] = ["gpu-a", *(f"made-up-{i}" for i in range(1000))]
    result = start_extender().post("/filter", args)[1]
    assert result["NodeNames"] == ["gpu-a"]
    assert result["FailedNodes"] == {"made-up-0": "unknown node: the API server lists no node of "
                                     "this name (nor of 999 more names asked about, left out)"}


def test_go_style_case_insensitive_field_names(cluster: Any,
                                               start_extender: Callable[..., Any]) -> None:
    args = captured("filter_args_names.json")
    lowered = {"pod": args["Pod"], "nodenames": args["NodeNames"]}
    assert start_extender().post("/filter", lowered)[1]["NodeNames"] == ["gpu-a", "gpu-b"]


def test_api_server_outage_is_an_error_field_not_a_crash(
        pod_json: Callable[..., dict], start_extender: Callable[..., Any], fake_api: Any) -> None:
    client = start_extender()
    fake_api.unavailable = True
    status, result = client.post("/filter", {"Pod": pod_json("p", gpus=1), "NodeNames": ["a"]})
    assert status == 200
    assert result["Error"] == ("listing nodes failed: HTTP 503: the server is currently unable "
                               "to handle the request")
    status, result = client.post("/prioritize", {"Pod": pod_json("p", gpus=1), "NodeNames": ["a"]})
    assert (status, result) == (200, [{"Host": "a", "Score": 0}])


def test_restart_rebuilds_state_and_resync_returns_gpus(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender_process: Callable[..., Any]) -> None:
    fake_api.add_node(node_json("n", gpus=8, topology_file="topo_dgx1_v100.txt"))
    first = start_extender_process("--resync-seconds", "0.2")
    quad = fake_api.add_pod(pod_json("quad", gpus=4))
    assert first.post("/bind", bind_args(quad, "n"))[1] == {"Error": ""}
    assert fake_api.pod("default", "quad")["metadata"]["annotations"]["gpu-sched/gpus"] == "0,1,2,3"

    restarted = start_extender_process()
    five = fake_api.add_pod(pod_json("five", gpus=5))
    result = restarted.post("/filter", {"Pod": five, "NodeNames": ["n"]})[1]
    assert result["FailedNodes"] == {"n": "only 4 of 8 GPUs free, pod asks 5"}

    fake_api.delete_pod("default", "quad")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if first.post("/filter", {"Pod": five, "NodeNames": ["n"]})[1]["NodeNames"] == ["n"]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the deleted pod's GPUs never came back")


def test_mangled_captured_bodies_never_crash_the_extender(
        cluster: Any, start_extender: Callable[..., Any]) -> None:
    """Swap every subtree of the captured bodies for values of the wrong type, one at a time."""
    client = start_extender()
    replacements: list[Any] = [None, 7, "x", [], {}, [None], {"a": None}, True, -1.5]

    def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        found = [prefix]
        children = value.items() if isinstance(value, dict) else enumerate(value) \
            if isinstance(value, list) else []
        for key, child in children:
            found.extend(paths(child, (*prefix, key)))
        return found

    statuses = set()
    for verb, body in (("/filter", captured("filter_args_names.json")),
                       ("/prioritize", captured("filter_args_nodes.json")),
                       ("/bind", captured("bind_args.json"))):
        for index, path in enumerate(paths(body)[1:]):
            mangled = copy.deepcopy(body)
            target = mangled
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = replacements[index % len(replacements)]
            status, result = client.post(verb, mangled)
            statuses.add(status)
            assert status in (200, 400), (verb, path, result)
            if status == 400:
                assert result["Error"] and "\n" not in result["Error"]
    assert statuses == {200, 400}


def _eight_gpu_cluster(fake_api: Any, pod_json: Callable[..., dict],
                       node_json: Callable[..., dict]) -> dict[str, Any]:
    fake_api.add_node(node_json("one", gpus=8))
    fake_api.add_node(node_json("two", gpus=8))
    return fake_api.add_pod(pod_json("first", gpus=8))


def _next_eight_gpu_pod_avoids_node_one(fake_api: Any, pod_json: Callable[..., dict],
                                        client: Any) -> None:
    assert fake_api.pod("default", "first")["metadata"]["annotations"]["gpu-sched/gpus"] == \
        "0,1,2,3,4,5,6,7"
    second = fake_api.add_pod(pod_json("second", gpus=8))
    result = client.post("/filter", {"Pod": second, "NodeNames": ["one", "two"]})[1]
    assert result["NodeNames"] == ["two"]
    assert result["FailedNodes"] == {"one": "only 0 of 8 GPUs free, pod asks 8"}
    assert client.post("/bind", bind_args(second, "one"))[1] == {
        "Error": "node one: only 0 of 8 GPUs free, pod asks 8"}
    assert "gpu-sched/gpus" not in fake_api.pod("default", "second")["metadata"].get(
        "annotations", {})


def test_retried_bind_with_a_late_pod_read_keeps_the_running_pods_gpus(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """Pod reads answered 0.4 s late: the retry reads the pod before the first bind lands and
    gets the answer after the first bind settled."""
    first = _eight_gpu_cluster(fake_api, pod_json, node_json)
    client = start_extender()
    assert client.post("/filter", {"Pod": first, "NodeNames": ["one", "two"]})[1][
        "NodeNames"] == ["one", "two"]
    fake_api.pod_read_delay = 0.4
    with ThreadPoolExecutor(max_workers=2) as pool:
        original = pool.submit(client.post, "/bind", bind_args(first, "one"))
        deadline = time.monotonic() + 5
        while fake_api.pod_reads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        retry = pool.submit(client.post, "/bind", bind_args(first, "one"))
        assert original.result() == (200, {"Error": ""})
        assert retry.result() == (200, {"Error": ""})
    assert fake_api.bindings_landed == 1
    fake_api.pod_read_delay = 0.0
    _next_eight_gpu_pod_avoids_node_one(fake_api, pod_json, client)


def test_a_409_for_a_binding_that_landed_keeps_the_pods_gpus(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """The binding goes through but the extender hears 409 (its answer lost, a retry refused)."""
    first = _eight_gpu_cluster(fake_api, pod_json, node_json)
    client = start_extender()
    fake_api.lost_binding_answers = 1
    assert client.post("/bind", bind_args(first, "one")) == (200, {"Error": ""})
    assert client.post("/bind", bind_args(first, "one")) == (200, {"Error": ""})
    assert fake_api.bindings_landed == 1
    assert fake_api.pod("default", "first")["spec"]["nodeName"] == "one"
    _next_eight_gpu_pod_avoids_node_one(fake_api, pod_json, client)
