"""The etcd of `--etcd URL[,URL...]`, as cluster writes use it: keys, leases, transactions.

Through etcd's HTTP gateway (the `etcd3gw` client the adapters' coordinator uses too). Several
URLs name members of one etcd cluster: a request that cannot reach one member goes to the next,
and the member that answered last is asked first. Every failure, whatever the client raised, is
an `EtcdUnavailable`, so callers have one thing to catch and fall back on (a write stays
node-durable, a take-over waits).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ...errors import AvafsError

Result = TypeVar("Result")


class EtcdUnavailable(Exception):
    """No member of the etcd cluster answered the request (or it failed there)."""


class Etcd:
    """One client per member; `timeout` bounds each request to a member."""

    def __init__(self, urls: tuple[str, ...], timeout: float) -> None:
        try:
            import etcd3gw
        except ImportError:
            raise AvafsError("--etcd needs the etcd3gw client: pip install 'avafs[cluster]'") \
                from None
        self.urls = urls
        self._clients = [etcd3gw.Etcd3Client(host=urlsplit(url).hostname,
                                             port=urlsplit(url).port,
                                             protocol=urlsplit(url).scheme, timeout=timeout)
                         for url in urls]
        self._lock = threading.Lock()
        """Guards `_first` only (a leaf)."""
        self._first = 0

    def _call(self, request: Callable[[Any], Result]) -> Result:
        with self._lock:
            first = self._first
        errors = []
        for step in range(len(self._clients)):
            index = (first + step) % len(self._clients)
            try:
                result = request(self._clients[index])
            except Exception as error:  # noqa: BLE001 - any member's failure: try the next
                # etcd3gw raises some failures without a message (a refused connection
                # is a bare ConnectionFailedError): the class names them then.
                errors.append(f"{self.urls[index]}: {str(error) or type(error).__name__}")
                continue
            with self._lock:
                self._first = index
            return result
        raise EtcdUnavailable("; ".join(errors))

    def check(self) -> None:
        self._call(lambda client: client.status())

    def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        return self._call(lambda client: client.lease(ttl).id)

    def refresh(self, lease: int) -> bool:
        """Keep the lease alive; False if it has expired already."""
        from etcd3gw.lease import Lease

        return self._call(lambda client: Lease(lease, client).refresh()) > 0

    def revoke(self, lease: int) -> None:
        from etcd3gw.lease import Lease

        self._call(lambda client: Lease(lease, client).revoke())

    def put(self, key: str, value: str, lease: int | None = None) -> None:
        from etcd3gw.lease import Lease

        self._call(lambda client: client.put(
            key, value, lease=None if lease is None else Lease(lease, client)))

    def put_if(self, items: list[tuple[str, str]], guard: str, guard_value: str) -> bool:
        """Put every (key, value) of `items` only if `guard` holds `guard_value` now (one
        transaction: all or none); False if it does not (it is absent or holds another value)."""
        from etcd3gw.utils import _encode

        def request(client: Any) -> bool:
            result = client.transaction({
                "compare": [{"key": _encode(guard), "result": "EQUAL", "target": "VALUE",
                             "value": _encode(guard_value)}],
                "success": [{"request_put": {"key": _encode(key), "value": _encode(value)}}
                            for key, value in items],
                "failure": []})
            return bool(result.get("succeeded", False))

        return self._call(request)

    def replace(self, old: str, items: list[tuple[str, str]]) -> bool:
        """Delete `old` and put every (key, value) of `items` only if `old` exists now (one
        transaction: all or none); False if it is gone."""
        from etcd3gw.utils import _encode

        def request(client: Any) -> bool:
            result = client.transaction({
                "compare": [{"key": _encode(old), "result": "GREATER", "target": "VERSION",
                             "version": 0}],
                "success": [{"request_delete_range": {"key": _encode(old)}}]
                + [{"request_put": {"key": _encode(key), "value": _encode(value)}}
                   for key, value in items],
                "failure": []})
            return bool(result.get("succeeded", False))

        return self._call(request)

    def create(self, key: str, value: str, lease: int) -> bool:
        """Create `key` bound to `lease` only if it is absent (one transaction); False if
        it exists."""
        from etcd3gw.lease import Lease

        return self._call(lambda client: client.create(key, value, lease=Lease(lease, client)))

    def get(self, key: str) -> str | None:
        found = self._call(lambda client: client.get(key))
        return _text(found[0]) if found else None

    def get_prefix(self, prefix: str) -> list[tuple[str, str]]:
        """(key, value) of every key under `prefix`, in key order."""
        found = self._call(lambda client: client.get_prefix(prefix, sort_order="ascend",
                                                            sort_target="key"))
        return [(_text(meta["key"]), _text(value)) for value, meta in found]

    def delete(self, key: str) -> None:
        self._call(lambda client: client.delete(key))

    def delete_all(self, keys: list[str]) -> None:
        """Delete every key of `keys` in one transaction (etcd bounds the operations of one
        transaction: 128 unless configured otherwise)."""
        from etcd3gw.utils import _encode

        self._call(lambda client: client.transaction({
            "compare": [],
            "success": [{"request_delete_range": {"key": _encode(key)}} for key in keys],
            "failure": []}))

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
