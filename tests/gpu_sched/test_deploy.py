"""The shipped manifests load strictly into the kubernetes client's models and agree with the code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from gpu_sched.k8s_objects import GPU_RESOURCE, MILLI_RESOURCE, pod_request
from gpu_sched.quota import parse_quota

DEPLOY = Path(__file__).resolve().parents[2] / "gpu_sched" / "deploy"

# Field names of k8s.io/kube-scheduler/config/v1 (KubeSchedulerConfiguration has no client model).
SCHEDULER_CONFIG_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
    "enableContentionProfiling", "percentageOfNodesToScore", "percentageOfPlacementsToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
    "delayCacheUntilActive",
}
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
MANAGED_RESOURCE_FIELDS = {"name", "ignoredByScheduler"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), f"{path.name}: every document must be a mapping"
            docs.append((path.name, doc))
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


@pytest.mark.parametrize("source, doc", [d for d in documents()
                                         if d[1]["kind"] != "KubeSchedulerConfiguration"],
                         ids=lambda value: value if isinstance(value, str) else value["kind"])
def test_manifest_loads_strictly_into_its_model(source: str, doc: dict[str, Any]) -> None:
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    model = getattr(client, f"{version.capitalize()}{doc['kind']}")
    loaded = model.model_validate(doc)
    assert loaded.metadata.name


def test_strict_loading_catches_a_misspelt_field() -> None:
    deployment = by_kind("Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["argz"] = ["--port", "1"]
    with pytest.raises(ValueError, match="argz"):
        client.V1Deployment.model_validate(deployment)


def test_scheduler_configuration_uses_only_real_fields() -> None:
    (config,) = by_kind("KubeSchedulerConfiguration")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert set(config) <= SCHEDULER_CONFIG_FIELDS
    (extender,) = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert all(set(resource) <= MANAGED_RESOURCE_FIELDS for resource in extender["managedResources"])
    assert {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]} == {
        GPU_RESOURCE: False, MILLI_RESOURCE: True, "cpu": False, "memory": False}
    assert extender["weight"] >= 1 and extender["nodeCacheCapable"] is True


def sent_to_extender(pod: dict[str, Any]) -> bool:
    """kube-scheduler's HTTPExtender.IsInterested: a container (init containers included) whose
    requests or limits name a managed resource."""
    (config,) = by_kind("KubeSchedulerConfiguration")
    managed = {r["name"] for r in config["extenders"][0]["managedResources"]}
    spec = pod["spec"]
    return any(set(container.get("resources", {}).get(kind) or {}) & managed
               for container in spec["containers"] + spec.get("initContainers", [])
               for kind in ("requests", "limits"))


def test_cpu_only_pods_reach_the_extender_as_gpu_pods_do(pod_json: Callable[..., dict]) -> None:
    """The simulator places CPU-only pods by the policy; as deployed they must reach it too."""
    assert sent_to_extender(pod_json("web", cpu="500m", memory="1Gi"))
    assert sent_to_extender(pod_json("train", gpus=2))
    for doc in by_kind("Pod"):
        assert sent_to_extender(doc)


def test_scheduler_reaches_the_extender_service_on_its_port() -> None:
    (config,) = by_kind("KubeSchedulerConfiguration")
    url = urlparse(config["extenders"][0]["urlPrefix"])
    (service,) = by_kind("Service")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}" \
                           ".svc.cluster.local"
    assert url.port == service["spec"]["ports"][0]["port"]
    (deployment,) = by_kind("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert int(args[args.index("--port") + 1]) == container["ports"][0]["containerPort"]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    quota_path = Path(args[args.index("--quota") + 1])
    mount = container["volumeMounts"][0]
    assert str(quota_path.parent) == mount["mountPath"]
    (config_map,) = by_kind("ConfigMap")
    assert parse_quota(config_map["data"][quota_path.name]).limits["team-a"] == 16


def test_rbac_grants_what_the_extender_and_agent_call() -> None:
    roles = {role["metadata"]["name"]: role["rules"] for role in by_kind("ClusterRole")}

    def granted(role: str) -> set[tuple[str, str]]:
        return {(resource, verb) for rule in roles[role] for resource in rule["resources"]
                for verb in rule["verbs"]}

    assert {("pods", "list"), ("pods", "get"), ("pods", "patch"), ("pods/binding", "create"),
            ("nodes", "list")} <= granted("gpu-sched-extender")
    assert {("nodes", "get"), ("nodes", "patch")} <= granted("gpu-sched-agent")


def test_scheduler_verbs_are_served(fake_api: Any, start_extender: Callable[..., Any],
                                    pod_json: Callable[..., dict]) -> None:
    (config,) = by_kind("KubeSchedulerConfiguration")
    extender = config["extenders"][0]
    http = start_extender()
    pod = pod_json("p", gpus=1)
    for verb in ("filterVerb", "prioritizeVerb"):
        status, _ = http.post("/" + extender[verb], {"Pod": pod, "NodeNames": []})
        assert status == 200
    status, result = http.post("/" + extender["bindVerb"], {
        "PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "n"})
    assert status == 200 and "not found" in result["Error"]


def test_example_pods_ask_for_gpus_the_way_the_extender_reads_them() -> None:
    requests = {pod["metadata"]["name"]: pod_request(pod) for pod in by_kind("Pod")}
    assert requests["resnet-train"].gpus == 2
    assert requests["bert-serving"].milli == 250
    assert requests["bert-serving"].models == {"Tesla-T4", "NVIDIA-A10"}
