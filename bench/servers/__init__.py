"""Servers on free loopback ports, for the benchmarks and the tests alike: a SeaweedFS
cluster (`seaweed`), a single-member etcd (`etcd_server`), a TCP proxy that injects store
faults or plays a slow link (`fault_proxy`), and the free ports they take (`ports`)."""
