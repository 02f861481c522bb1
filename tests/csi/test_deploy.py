"""The deployment files: valid Kubernetes objects that agree with each other and the driver.

No cluster and no docker engine run here, so each manifest is loaded into the kubernetes
client's models (which know every field of every kind) and must come back unchanged, which
catches a misspelled or misplaced field; the Dockerfile is checked for what it installs.
"""

from __future__ import annotations

import configparser
import inspect
import json
import re
import shlex
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from avafs import __version__
from csi_driver import DEFAULT_DRIVER_NAME
from csi_driver.__main__ import build_parser
from csi_driver.capabilities import PROVISIONED_MODES
from csi_driver.proto import csi_pb2
from csi_driver.provisioning import RESERVED_PREFIX, parse_parameters
from csi_driver.volume_spec import parse_credentials, parse_volume_context

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "csi_driver" / "deploy"
README = REPO / "csi_driver" / "README.md"
MODELS = {
    ("storage.k8s.io/v1", "CSIDriver"): "V1CSIDriver",
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("v1", "Secret"): "V1Secret",
    ("v1", "PersistentVolume"): "V1PersistentVolume",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Pod"): "V1Pod",
    ("batch/v1", "Job"): "V1Job",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("storage.k8s.io/v1", "StorageClass"): "V1StorageClass",
}
ACCESS_MODES = {"ReadWriteOnce": csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
                "ReadOnlyMany": csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY,
                "ReadWriteMany": csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER}
"""How the external-provisioner turns a claim's access modes into CSI's."""


class _Response:
    """What older kubernetes clients' ApiClient.deserialize reads: the body as `.data`."""

    def __init__(self, document: dict) -> None:
        self.data = json.dumps(document)


def _deserialize(api: kubernetes.client.ApiClient, document: dict, model: str):
    """Newer kubernetes clients take the body text and a content type instead of `.data`."""
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(json.dumps(document), model, "application/json")
    return api.deserialize(_Response(document), model)


def load_model(document: dict):
    """The document as a kubernetes model; fails if any key is unknown to that model.

    `deserialize` drops keys it does not know, so a document that survives the round trip
    to the model and back unchanged has no misspelled or misplaced field.
    """
    api = kubernetes.client.ApiClient()
    model = MODELS[(document["apiVersion"], document["kind"])]
    loaded = _deserialize(api, document, model)
    assert api.sanitize_for_serialization(loaded) == document, (
        f"{document['kind']} {document['metadata']['name']}: fields lost in the round trip")
    return loaded


def manifests() -> dict[str, list[dict]]:
    return {path.name: list(yaml.safe_load_all(path.read_text()))
            for path in sorted(DEPLOY.glob("*.yaml"))}


def the(kind: str, file: str | None = None) -> dict:
    """The one document of `kind` (in `file`, where several files have one)."""
    [document] = [doc for name, docs in manifests().items() for doc in docs
                  if doc["kind"] == kind and file in (None, name)]
    return document


def test_every_document_loads_into_its_kubernetes_model():
    loaded = {name: [load_model(document) for document in documents]
              for name, documents in manifests().items()}
    assert {type(model).__name__ for models in loaded.values() for model in models} == set(
        MODELS.values())


def test_the_round_trip_catches_a_misspelled_field():
    daemonset = the("DaemonSet")
    mount = daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]
    mount["mountPropogation"] = mount.pop("mountPropagation")
    with pytest.raises(AssertionError, match="fields lost"):
        load_model(daemonset)


def test_csidriver_matches_what_the_plugin_is():
    driver = the("CSIDriver")
    assert driver["metadata"]["name"] == DEFAULT_DRIVER_NAME
    assert driver["spec"]["attachRequired"] is False
    assert driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["fsGroupPolicy"] == "File"  # with the VOLUME_MOUNT_GROUP capability
    assert driver["spec"]["volumeLifecycleModes"] == ["Persistent", "Ephemeral"]
    assert the("PersistentVolume")["spec"]["csi"]["driver"] == DEFAULT_DRIVER_NAME
    assert the("StorageClass")["provisioner"] == DEFAULT_DRIVER_NAME


def test_daemonset_wires_plugin_sidecars_and_kubelet_together():
    pod = the("DaemonSet")["spec"]["template"]["spec"]
    containers = {container["name"]: container for container in pod["containers"]}
    plugin = containers["avafs-csi-plugin"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount for mount in plugin["volumeMounts"]}

    arguments = build_parser().parse_args(
        [argument.replace("$(NODE_NAME)", "node-1") for argument in plugin["args"]])
    assert plugin["securityContext"]["privileged"] is True
    assert mounts["kubelet-dir"]["mountPropagation"] == "Bidirectional"
    assert volumes["kubelet-dir"]["hostPath"]["path"] == "/var/lib/kubelet"
    assert plugin["image"] == f"avafs-csi:{__version__}"

    socket_dir = volumes["socket-dir"]["hostPath"]["path"]
    assert socket_dir.rstrip("/") == f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER_NAME}"
    in_container = Path(mounts["socket-dir"]["mountPath"]) / "csi.sock"
    assert arguments.endpoint == in_container
    registrar = containers["node-driver-registrar"]["args"]
    assert f"--csi-address={in_container}" in registrar
    assert f"--kubelet-registration-path={socket_dir.rstrip('/')}/csi.sock" in registrar
    assert f"--csi-address={in_container}" in containers["liveness-probe"]["args"]

    health_port = next(a for a in containers["liveness-probe"]["args"] if "health-port" in a)
    [port] = plugin["ports"]
    assert health_port == f"--health-port={port['containerPort']}"
    assert plugin["livenessProbe"]["httpGet"]["port"] == port["name"]
    for host_path in (arguments.state_dir, arguments.cache_root):
        assert any(Path(mount["mountPath"]) == host_path for mount in plugin["volumeMounts"])


def test_example_volume_is_one_the_plugin_accepts():
    volume = the("PersistentVolume")
    claim = the("PersistentVolumeClaim", "example-pv-pvc.yaml")
    secret = the("Secret")
    csi = volume["spec"]["csi"]
    # A dataset volume: read-only by its access mode, which kubelet hands the plugin.
    assert volume["spec"]["accessModes"] == claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    spec, _ = parse_volume_context(csi["volumeAttributes"], read_only=True)
    assert "--read-only" in spec.mount_flags()
    assert parse_credentials(secret["stringData"]) is not None
    assert csi["nodeStageSecretRef"] == {"name": secret["metadata"]["name"],
                                         "namespace": secret["metadata"]["namespace"]}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"] == {"namespace": claim["metadata"]["namespace"],
                                          "name": claim["metadata"]["name"]}
    for workload in (the("Pod")["spec"],
                     the("Job", "example-warmup-job.yaml")["spec"]["template"]["spec"]):
        claims = [v["persistentVolumeClaim"]["claimName"] for v in workload["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [claim["metadata"]["name"]]
    assert the("Job", "example-warmup-job.yaml")["spec"]["template"]["spec"]["containers"][0][
        "command"][:2] == [
        "avafs", "warmup"]


def _extras(requirement: str) -> tuple[str, set[str]]:
    match = re.fullmatch(r"([\w.-]+)\[([\w,]+)\]", requirement)
    assert match, requirement
    return match.group(1), set(match.group(2).split(","))


def test_dockerfile_installs_what_the_readme_installs():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    readme = README.read_text()
    [readme_install] = re.findall(r"pip install '(\.\[[\w,]+\])'", readme)
    _, readme_extras = _extras(readme_install)

    commands = " ".join(line.strip() for line in dockerfile.replace("\\\n", " ").splitlines())
    [built] = re.findall(r"pip wheel [^&]*?'(\.\[[\w,]+\])'", commands)
    [installed] = re.findall(r"pip install [^&]*?'([\w-]+\[[\w,]+\])'", commands)
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert _extras(built) == (".", readme_extras)
    assert _extras(installed) == (setup["metadata"]["name"], readme_extras)
    assert readme_extras <= set(setup["options.extras_require"])

    stages = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert stages and all(image.startswith("python:3.11-slim") for image in stages)
    final_stage = dockerfile.split("\nFROM ")[-1]
    installed_packages = re.search(r"apt-get install ([^&]*)", final_stage.replace("\\\n", " "))
    assert installed_packages and {"fuse3", "tini"} <= set(installed_packages.group(1).split())
    [entrypoint] = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)
    assert json.loads(entrypoint) == ["tini", "--", "python", "-m", "csi_driver"]


def test_readme_build_command_tags_the_image_the_daemonset_runs():
    [build] = re.findall(r"^docker build .+$", README.read_text(), re.MULTILINE)
    arguments = shlex.split(build)
    assert arguments[arguments.index("-f") + 1] == "csi_driver/deploy/Dockerfile"
    image = the("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert arguments[arguments.index("-t") + 1] == image


def test_controller_deployment_wires_plugin_and_provisioner_together():
    deployment = the("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    containers = {container["name"]: container for container in pod["containers"]}
    plugin = containers["avafs-csi-plugin"]
    arguments = build_parser().parse_args(plugin["args"])
    assert arguments.mode == "controller"
    assert plugin["image"] == f"avafs-csi:{__version__}"
    assert "securityContext" not in plugin  # mounts nothing: not privileged
    [mount] = plugin["volumeMounts"]
    in_container = Path(mount["mountPath"]) / "csi.sock"
    assert arguments.endpoint == in_container
    for sidecar in ("csi-provisioner", "liveness-probe"):
        assert f"--csi-address={in_container}" in containers[sidecar]["args"]
        assert containers[sidecar]["volumeMounts"] == [mount]
    provisioner = containers["csi-provisioner"]["args"]
    assert "--leader-election" in provisioner
    assert (f"--leader-election-namespace={deployment['metadata']['namespace']}"
            in provisioner)
    health_port = next(a for a in containers["liveness-probe"]["args"] if "health-port" in a)
    [port] = plugin["ports"]
    assert health_port == f"--health-port={port['containerPort']}"


def test_provisioner_rbac_grants_what_the_external_provisioner_uses():
    account = the("ServiceAccount", "controller-rbac.yaml")
    assert the("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == \
        account["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"],
               "namespace": account["metadata"]["namespace"]}
    for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        assert the(binding)["subjects"] == [subject]
        assert the(binding)["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                           "kind": role, "name": the(role)["metadata"]["name"]}
    granted = {(group, resource, verb) for rule in the("ClusterRole")["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    needed = {("", "persistentvolumes", verb) for verb in ("create", "delete", "watch")} | {
        ("", "persistentvolumeclaims", "update"), ("storage.k8s.io", "storageclasses", "get"),
        ("", "secrets", "get"), ("", "events", "create")}
    assert needed <= granted
    assert ("coordination.k8s.io", "leases") in {
        (group, resource) for rule in the("Role")["rules"] for group in rule["apiGroups"]
        for resource in rule["resources"]}
    assert the("Role")["metadata"]["namespace"] == the("Deployment")["metadata"]["namespace"]


def test_storage_class_claim_and_job_agree_with_the_controller():
    storage_class = the("StorageClass")
    parameters = storage_class["parameters"]
    parsed = parse_parameters(parameters)
    assert parsed.reclaim == "delete"
    secret = the("Secret")
    for use in ("provisioner", "node-stage"):
        assert parameters[f"{RESERVED_PREFIX}{use}-secret-name"] == secret["metadata"]["name"]
        assert parameters[f"{RESERVED_PREFIX}{use}-secret-namespace"] == \
            secret["metadata"]["namespace"]
    claim = the("PersistentVolumeClaim", "example-dynamic-job.yaml")
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    assert {ACCESS_MODES[mode] for mode in claim["spec"]["accessModes"]} <= PROVISIONED_MODES
    job = the("Job", "example-dynamic-job.yaml")
    assert job["metadata"]["namespace"] == claim["metadata"]["namespace"]
    [volume] = job["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    [mount] = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert mount["name"] == volume["name"]
    assert mount["mountPropagation"] == "HostToContainer"


def _walkthrough_commands() -> list[list[str]]:
    """The README's `kubectl` and `sed` command lines, in order, as argument lists."""
    return [shlex.split(line.strip()) for line in README.read_text().splitlines()
            if line.startswith("    ") and line.strip().split(" ")[0] in ("kubectl", "sed")]


def test_readme_walkthrough_creates_each_namespace_before_applying_into_it():
    namespaces = {"default"}
    applied = []
    for command in _walkthrough_commands():
        if command[:3] == ["kubectl", "create", "namespace"]:
            namespaces.add(command[3])
        if command[:2] != ["kubectl", "apply"]:
            continue
        for file in (command[index + 1] for index, word in enumerate(command) if word == "-f"):
            path = REPO / file
            assert path.is_file(), f"the README applies {file}, which does not exist"
            applied.append(path.name)
            for document in yaml.safe_load_all(path.read_text()):
                if document["kind"] == "Namespace":
                    namespaces.add(document["metadata"]["name"])
                namespace = document["metadata"].get("namespace")
                assert namespace is None or namespace in namespaces, (
                    f"{file}: {document['kind']} {document['metadata']['name']} is applied "
                    f"before its namespace {namespace} exists")
    assert {name for name in manifests() if not name.startswith("example-")} <= set(applied)
    assert {"example-storageclass.yaml", "example-dynamic-job.yaml"} <= set(applied)


def test_readme_retag_command_points_every_plugin_image_at_the_registry():
    [sed] = [command for command in _walkthrough_commands() if command[0] == "sed"]
    _, old, new, _ = sed[2].split("|")
    retagged = {Path(file).name for file in sed[3:]}
    running_the_plugin = {name for name, text in
                          ((path.name, path.read_text()) for path in DEPLOY.glob("*.yaml"))
                          if old in text}
    assert running_the_plugin == retagged
    image = the("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert old == f"image: {image}" and new.startswith("image: ") and new.endswith(f"/{image}")
