"""avafs CSI plugin: mounts buckets into Kubernetes pods, keeps the mounts alive, provisions.

One avafs daemon per volume per node serves every pod on that node from one shared cache
(stage); each pod gets a bind mount of its sub-directory (publish). Everything the driver did
is recorded in a state directory, so a restarted driver adopts live mounts and repairs dead
ones instead of leaving pods with "Transport endpoint is not connected".
"""

DEFAULT_DRIVER_NAME = "csi.avafs.io"
