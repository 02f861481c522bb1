"""CSI ephemeral inline volumes: `csi:` in a pod spec, published without a stage.

kubelet sends NodePublishVolume with `csi.storage.k8s.io/ephemeral: "true"`, the pod's
`volumeAttributes` and its `nodePublishSecretRef` as secrets, and no staging path; the plugin
stages the volume itself and lets it go, cache included, when the pod's target is unpublished.
"""

from __future__ import annotations

from csi_driver.proto import csi_pb2

MODE = csi_pb2.VolumeCapability.AccessMode
SECRETS = {"accessKeyId": "testing-key-id", "secretAccessKey": "testing-secret-key"}


def publish_inline(kubelet, volume_id: str, target, attributes: dict[str, str],
                   readonly: bool = False) -> None:
    kubelet.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id, target_path=str(target), readonly=readonly,
        volume_capability=kubelet.capability(MODE.SINGLE_NODE_WRITER),
        volume_context={**attributes, "csi.storage.k8s.io/ephemeral": "true",
                        "csi.storage.k8s.io/pod.name": "trainer-0"},
        secrets=SECRETS), timeout=150)


def test_inline_volume_mounts_without_stage_and_goes_with_its_pod(driver, kubelet, s3_dataset,
                                                                  mountinfo):
    target = kubelet.target_path("trainer-0", "csi-inline-1")
    publish_inline(kubelet, "csi-inline-1", target, s3_dataset.attributes, readonly=True)
    publish_inline(kubelet, "csi-inline-1", target, s3_dataset.attributes, readonly=True)
    assert (target / "labels.txt").read_bytes() == s3_dataset.visible_to_alice()["labels.txt"]
    assert "ro" in mountinfo.at(target)[0].options
    [staged] = [m for m in mountinfo.under(driver.state_dir) if m.fstype == "fuse.avafs"]
    assert staged.mount_point.startswith(str(driver.state_dir / "ephemeral"))
    stats = kubelet.stats("csi-inline-1", target)
    assert not stats.volume_condition.abnormal

    kubelet.unpublish("csi-inline-1", target)
    kubelet.unpublish("csi-inline-1", target)
    assert not mountinfo.under(driver.root)
    assert not target.exists()
    assert driver.live_daemons() == []
    assert not list((driver.state_dir / "ephemeral").iterdir())
    assert not driver.cache_root.exists() or not list(driver.cache_root.iterdir())
    assert SECRETS["secretAccessKey"] not in driver.log()
