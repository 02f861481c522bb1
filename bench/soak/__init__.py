"""The reliability soaks (README.md, "Reliability"): `crash_loop` (random file work, kill -9
of the daemon, remount, check) and `fault_soak` (a mount used through every kind of store
fault)."""
