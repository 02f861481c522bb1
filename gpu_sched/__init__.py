"""Topology-aware, bin-packing GPU placement for Kubernetes, plus a trace simulator to compare policies.

The placement code is shared: the kube-scheduler extender and the simulator call the same functions,
so what the simulator reports is what the extender would have done.
"""
