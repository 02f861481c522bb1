"""The daemon's control socket: newline-delimited JSON over a Unix socket in the cache dir.

A request is one line `{"op": ..., ...}`; the answer is any number of `{"progress": {...}}`
lines and then one `{"result": {...}}` or `{"error": "one line"}`. A result may announce
`"payload": N`: N raw bytes follow its line (file contents, which JSON would inflate). A
connection carries any number of requests, one after the other. The socket is created mode
0600 inside the cache dir, so only root and the mount's owner can drive the daemon. Paths
longer than a socket address allows are reached through /proc/self/fd.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AvafsError

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class WithPayload:
    """A result whose answer carries raw bytes after its JSON line."""

    result: dict[str, Any]
    payload: list[bytes]


Handler = Callable[[dict[str, Any], Progress], "dict[str, Any] | WithPayload"]


@contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A path to `path` that fits in a sockaddr_un (108 bytes), through a directory fd."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


class _RequestHandler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        for line in self.rfile:
            try:
                request = json.loads(line)
                handler = self.server.handlers.get(request.get("op"))
                if handler is None:
                    raise AvafsError(f"unknown control operation {request.get('op')!r}")
                answer = handler(request, self._send_progress)
                if isinstance(answer, WithPayload):
                    self._send({"result": answer.result,
                                "payload": sum(map(len, answer.payload))}, answer.payload)
                else:
                    self._send({"result": answer})
            except (AvafsError, ValueError, TypeError) as error:
                self._send({"error": str(error)})
            except BrokenPipeError:
                return
            except Exception as error:  # noqa: BLE001 - the daemon must outlive a bad request
                log.exception("control request failed")
                self._send({"error": f"internal error: {error}"})

    def _send_progress(self, progress: dict[str, Any]) -> None:
        self._send({"progress": progress})

    def _send(self, message: dict[str, Any], payload: list[bytes] = ()) -> None:
        self.wfile.write(json.dumps(message).encode() + b"\n")
        self.wfile.writelines(payload)
        self.wfile.flush()


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.path = path
        path.unlink(missing_ok=True)
        old_umask = os.umask(0o077)
        try:
            with short_path(path) as address:
                super().__init__(address, _RequestHandler)
                os.chmod(address, 0o600)
        finally:
            os.umask(old_umask)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="avafs-control")
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.path.unlink(missing_ok=True)


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
