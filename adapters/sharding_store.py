"""Durable state for the sharding coordinator: a local SQLite file, or etcd for multi-machine jobs.

Both stores offer the same three operations on JSON records with a per-key version: read a prefix,
read a key, and compare-and-put (write only if the key's version is still the one read). The
version check makes a write from a coordinator that lost track of the state fail loudly instead of
overwriting newer progress, for example a second coordinator started by mistake on the same etcd
prefix. Every write is durable before it returns: SQLite commits in WAL mode with
`synchronous=FULL`; etcd acknowledges a transaction once a quorum has it in its log.

In etcd the record version is the key's own `version` (0 when absent, +1 per put), so the
compare is a native transaction guard rather than a field inside the value.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

Record = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Versioned:
    value: Record
    version: int


class VersionConflict(RuntimeError):
    """The key changed since it was read: someone else is writing this coordinator's state."""


class StateStore(Protocol):
    def scan(self, prefix: str) -> dict[str, Versioned]: ...

    def get(self, key: str) -> Versioned | None: ...

    def put(self, key: str, value: Record, expected_version: int) -> int:
        """Writes if the key's version is `expected_version` (0: absent); returns the new one."""
        ...

    def close(self) -> None: ...


class SQLiteStore:
    """The embedded default: one file, no server, safe against a coordinator crash."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OSError(f"{self.path.parent}: cannot create the directory for the state file "
                          f"({error.strerror})") from None
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, "
                         "value TEXT NOT NULL, version INTEGER NOT NULL)")

    def scan(self, prefix: str) -> dict[str, Versioned]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, value, version FROM records WHERE substr(key, 1, ?) = ?",
                (len(prefix), prefix)).fetchall()
        return {key: Versioned(json.loads(value), version) for key, value, version in rows}

    def get(self, key: str) -> Versioned | None:
        with self._lock:
            row = self._db.execute("SELECT value, version FROM records WHERE key = ?",
                                   (key,)).fetchone()
        return None if row is None else Versioned(json.loads(row[0]), row[1])

    def put(self, key: str, value: Record, expected_version: int) -> int:
        encoded = json.dumps(value, sort_keys=True)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT version FROM records WHERE key = ?",
                                       (key,)).fetchone()
                current = 0 if row is None else row[0]
                if current != expected_version:
                    raise VersionConflict(f"{key}: version {current}, expected {expected_version}")
                self._db.execute("INSERT OR REPLACE INTO records (key, value, version) "
                                 "VALUES (?, ?, ?)", (key, encoded, current + 1))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return expected_version + 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


class EtcdStore:
    """State in etcd under a key prefix, through its HTTP gateway (the `etcd3gw` client)."""

    def __init__(self, host: str, port: int, prefix: str = "/avafs/sharding/",
                 timeout: float = 10.0) -> None:
        import etcd3gw

        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.endpoint = f"{host}:{port}"
        self._etcd = etcd3gw.Etcd3Client(host=host, port=port, timeout=timeout)
        try:
            self._etcd.status()
        except etcd3gw.exceptions.Etcd3Exception as error:
            raise ConnectionError(f"etcd at {self.endpoint} is not reachable: {error}") from None

    def scan(self, prefix: str) -> dict[str, Versioned]:
        records = {}
        for value, meta in self._etcd.get_prefix(self.prefix + prefix):
            key = meta["key"].decode() if isinstance(meta["key"], bytes) else meta["key"]
            records[key[len(self.prefix):]] = Versioned(json.loads(value), int(meta["version"]))
        return records

    def get(self, key: str) -> Versioned | None:
        found = self._etcd.get(self.prefix + key, metadata=True)
        if not found:
            return None
        value, meta = found[0]
        return Versioned(json.loads(value), int(meta["version"]))

    def put(self, key: str, value: Record, expected_version: int) -> int:
        full_key = _base64(self.prefix + key)
        result = self._etcd.transaction({
            "compare": [{"key": full_key, "result": "EQUAL", "target": "VERSION",
                         "version": expected_version}],
            "success": [{"request_put": {"key": full_key,
                                         "value": _base64(json.dumps(value, sort_keys=True))}}],
            "failure": [],
        })
        if not result.get("succeeded", False):
            raise VersionConflict(f"{key}: changed in etcd since version {expected_version}")
        return expected_version + 1

    def close(self) -> None:
        self._etcd.session.close()


def _base64(text: str) -> str:
    """The gateway's JSON encoding of bytes fields."""
    return base64.b64encode(text.encode()).decode()


def open_store(spec: str) -> StateStore:
    """`etcd://HOST:PORT[/PREFIX]`, or a path to the SQLite state file (created if missing)."""
    if spec.startswith("etcd://"):
        url = urlsplit(spec)
        if not url.hostname or not url.port:
            raise ValueError(f"{spec}: expected etcd://HOST:PORT[/PREFIX]")
        return EtcdStore(url.hostname, url.port, prefix=url.path or "/avafs/sharding/")
    if "://" in spec:
        raise ValueError(f"{spec}: state must be a file path or etcd://HOST:PORT[/PREFIX]")
    return SQLiteStore(spec)
