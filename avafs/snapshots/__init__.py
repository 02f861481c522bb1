"""Snapshots: a source's tree pinned as it was at one moment, served read-only later.

A snapshot is one object in the source under `SNAPSHOTS_PREFIX` (`record.py` says its
format), made by one recursive listing (`catalog.py`); a mount of it answers listings and
attributes from the record and reads each file's recorded version (`store.py`); `diff.py`
compares two of them and `actions.py` runs the `avafs snapshot` commands, in the CLI for a
bucket URL and in the daemon for a path in a mount.
"""
