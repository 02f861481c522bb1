"""Waiting until the store has what was written (`flush`, close under --writeback sync) and
what the status reports of it; a part of WriteBack (manager.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .pending import Pending

log = logging.getLogger(__name__)


class Flushing:
    def wait_settled(self, entries: list[Pending], timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while any(self._pending.get(entry.slot) is entry and not self._stored(entry)
                      for entry in entries):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.changed.wait(remaining if remaining is not None else 1.0)
        return True

    def flush(self, progress: Callable[[dict], None] | None = None,
              selects: Callable[[Pending], bool] | None = None,
              timeout: float | None = None) -> dict:
        """Upload everything now (everything `selects` picks, if given) and wait until nothing
        is pending but what the store refuses for good, or `timeout` seconds; the status of what
        is still pending is returned. Each set-aside state gets one more attempt (the cause may
        have been fixed, e.g. a bucket policy), and the result's `set_aside` names those refused
        again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.eager = True
        try:
            with self.lock:
                for entry in self._pending.values():
                    if entry.set_aside is not None:
                        entry.set_aside, entry.next_attempt = None, 0.0
                self.work.notify_all()
                while self._waiting_for_flush(selects):
                    remaining = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                    if remaining <= 0:
                        break
                    if progress is not None:
                        progress(self.status(selects))
                    self.changed.wait(remaining)
        finally:
            self.eager = False
        return self.status(selects)

    def _waiting_for_flush(self, selects: Callable[[Pending], bool] | None) -> bool:
        """Whether some pending state (of those `selects` picks) can still reach the store: it
        is not set aside and does not wait for a key whose state is."""
        refused = {entry.slot for entry in self._pending.values() if entry.set_aside is not None}
        return any(entry.set_aside is None and (selects is None or selects(entry))
                   and not any((entry.source, other) in refused for other in entry.wait_for)
                   for entry in self._pending.values())

    def status(self, selects: Callable[[Pending], bool] | None = None) -> dict[str, Any]:
        """Dirty bytes and pending changes, of those `selects` picks if given."""
        with self.lock:
            if selects is None:
                pending = list(self._pending.values())
                dirty, files = self.dirty_bytes, len(self._file_dirty)
            else:
                pending = [entry for entry in self._pending.values() if selects(entry)]
                held = {entry.file for entry in pending if entry.file in self._file_dirty}
                dirty, files = sum(self._file_dirty[name] for name in held), len(held)
            return {"bytes": dirty,
                    "files": files,
                    "upload_queue": len(pending),
                    "uploading": sum(entry.uploading for entry in pending),
                    "set_aside": [{"source": entry.source, "key": entry.key,
                                   "error": entry.set_aside} for entry in pending
                                  if entry.set_aside is not None]}
