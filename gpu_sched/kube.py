"""The few API server calls gpu_sched makes, through the official kubernetes client.

Responses are read as raw JSON rather than the client's model objects: the rest of gpu_sched reads
the API's own JSON shape (the same shape kube-scheduler sends the extender), and decoding thousands
of pods into models would cost more than the scheduling itself. Failures surface as KubeError with
one line that says which call failed and what the API server answered.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    """An API server call that failed; str() is one line fit for a log or a scheduler event."""


def api_client(api_url: str | None = None) -> client.ApiClient:
    """A client for an explicit URL, else in-cluster credentials, else the local kubeconfig."""
    configuration = client.Configuration()
    try:
        if api_url:
            configuration.host = api_url
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise KubeError(f"no Kubernetes API to talk to: {exc} (pass --kube-api URL)") from exc
    configuration.retries = 1
    return client.ApiClient(configuration)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(exc.body or "").get("message") or message
        return f"HTTP {exc.status}: {message}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class KubeClient:
    def __init__(self, api: client.ApiClient, timeout: float = 10.0) -> None:
        self._core = client.CoreV1Api(api)
        self._timeout = timeout

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = method(*args, _preload_content=False, _request_timeout=self._timeout,
                              **kwargs)
            return json.loads(response.data or b"null")
        except (ApiException, HTTPError, OSError, ValueError) as exc:
            raise KubeError(f"{what} failed: {_describe(exc)}") from exc

    def list_pods(self) -> list[dict[str, Any]]:
        return self._call("listing pods", self._core.list_pod_for_all_namespaces).get("items") or []

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"reading pod {namespace}/{name}", self._core.read_namespaced_pod,
                          name, namespace)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._call(f"annotating pod {namespace}/{name}", self._core.patch_namespaced_pod, name,
                   namespace, {"metadata": {"annotations": annotations}},
                   _content_type=MERGE_PATCH)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = client.V1Binding(
            api_version="v1", kind="Binding",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        self._call(f"binding pod {namespace}/{name} to {node}",
                   self._core.create_namespaced_pod_binding, name, namespace, body)

    def get_pvc(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"reading persistentvolumeclaim {namespace}/{name}",
                          self._core.read_namespaced_persistent_volume_claim, name, namespace)

    def get_pv(self, name: str) -> dict[str, Any]:
        return self._call(f"reading persistentvolume {name}", self._core.read_persistent_volume,
                          name)

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._call("listing nodes", self._core.list_node).get("items") or []

    def annotate_node(self, name: str, annotations: dict[str, str]) -> None:
        self._call(f"annotating node {name}", self._core.patch_node, name,
                   {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH)
