"""The control socket's wire format, and a reader's end of it: newline-delimited JSON over a
Unix socket in the cache dir.

A request is one line `{"op": ..., ...}`; the answer is any number of `{"progress": {...}}`
lines and then one `{"result": {...}}` or `{"error": "one line"}`. A result may announce
`"payload": N`: N raw bytes follow its line (file contents, which JSON would inflate). A
connection carries any number of requests, one after the other. Paths longer than a socket
address allows are reached through /proc/self/fd. The daemon's end is
`avafs/control/server.py`; this one is loaded by reader processes, so it imports nothing of
the data path.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AvafsError

SOCKET_NAME = "control.sock"
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class WithPayload:
    """A result whose answer carries raw bytes after its JSON line."""

    result: dict[str, Any]
    payload: list[bytes | memoryview]


@contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A path to `path` that fits in a sockaddr_un (108 bytes), through a directory fd."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


class Connection:
    """One connection to a daemon, for any number of requests in turn (not thread-safe)."""

    def __init__(self, path: Path, timeout: float | None = 60.0) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout)
        try:
            with short_path(path) as address:
                self._socket.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            self._socket.close()
            raise AvafsError(f"the mount's daemon does not answer on {path}: is it still "
                             "running?") from None
        except PermissionError:
            self._socket.close()
            raise AvafsError(f"permission denied on {path}: run as root or as the user who "
                             "mounted") from None
        self._replies = self._socket.makefile("rb")

    def request(self, request: dict[str, Any], progress: Progress | None = None,
                timeout: float | None = 60.0) -> tuple[dict[str, Any], bytes]:
        """The result of one request and its payload (empty without one); progress lines
        go to `progress`."""
        self._socket.settimeout(timeout)
        self._socket.sendall(json.dumps(request).encode() + b"\n")
        for line in self._replies:
            message = json.loads(line)
            if "progress" in message:
                if progress is not None:
                    progress(message["progress"])
            elif "error" in message:
                raise AvafsError(message["error"])
            else:
                size = message.get("payload", 0)
                payload = self._replies.read(size) if size else b""
                if len(payload) != size:
                    break
                return message["result"], payload
        raise AvafsError("the mount's daemon closed the control connection without an answer")

    def close(self) -> None:
        self._replies.close()
        self._socket.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def call(path: Path, request: dict[str, Any], progress: Progress | None = None,
         timeout: float | None = 60.0) -> dict[str, Any]:
    """Send one request on a connection of its own; returns the result or raises."""
    with Connection(path, timeout) as connection:
        return connection.request(request, progress, timeout)[0]
