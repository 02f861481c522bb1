"""What the benchmark is made of: the store on loopback and direct traffic (`s3server`), the
file systems under test (`mounts`), datasets and timed reads (`common`), the timed operations
(`workloads`, `training`, `epoch_reader`), one round (`runner`), py-spy profiles
(`profiling`), and the table and JSON it reports (`report`)."""
