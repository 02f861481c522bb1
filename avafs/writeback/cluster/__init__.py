"""--writeback cluster: committed files staged in an S3-compatible store inside the cluster
(queue.py, streams.py, staging.py), with their pending records and every node's lease in etcd
(coordination.py), so that any surviving node finishes a lost node's uploads (takeover.py)."""
