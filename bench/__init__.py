"""avafs's benchmarks, run from the repository root as modules (BENCHMARKS.md says how).

The entry points sit at this level: `benchmark` (avafs against local disk, a direct download
and the peers), `probes` (the short probes behind the optimizations), `adapters_bench`,
`dataset_cache`, `cluster_tier`, `cluster_writes` and `gpu_arrival`. Their rooms:

- `harness/`: what the benchmark is made of: the store on loopback, the mounts under test,
  datasets and timed reads, the workloads, one round, profiling, the report.
- `servers/`: the servers and the proxy the benchmarks and the tests run on loopback
  (SeaweedFS, etcd, the fault proxy, free ports).
- `experiments/`: one-off drivers behind a decision: the S3 transports A/B, the store
  clients, a pyfuse3 file system that does nothing.
- `soak/`: the reliability soaks: the kill -9 crash loop and the store-fault soak.

Not part of the installed distribution.
"""
