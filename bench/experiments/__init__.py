"""One-off drivers behind a decision, each run by hand: avafs's S3 transports on and off
(`s3_transports`), boto3 threads against aiobotocore (`store_clients`), and a pyfuse3 file
system that does nothing, pyfuse3's own ceiling (`trivial_fs`, mounted by `bench.probes`)."""
