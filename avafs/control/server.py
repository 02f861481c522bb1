"""The daemon's end of the control socket, whose wire format `avafs/reader/control_socket.py`
describes: each connection's requests in a thread of its own, each operation answered by its
handler (`operations.py`). The socket is created mode 0600 inside the cache dir, so only root
and the mount's owner can drive the daemon.
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import AvafsError
from ..reader.control_socket import Progress, WithPayload, short_path

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Progress], "dict[str, Any] | WithPayload"]


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

    def _send(self, message: dict[str, Any], payload: list[bytes | memoryview] = ()) -> None:
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
