"""Warmup and flush progress for people: a bar on a terminal, plain periodic lines in logs.

A warmup can run for hours, so it always says how far it got. Both modes print the same words,
built here from the daemon's progress documents: files as a count, bytes in powers of 1024
(`format_size`), and the phase the daemon is in. The bar's percentage is of the bytes the warmup
plans to load, and it is drawn at 100% once the warmup is done (the last progress line can
predate the last loaded block); in plain mode the summary line says the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

from ..config.sizes import format_size


class _Display:
    """A one-task rich bar on a terminal; plain lines every `plain_interval` s elsewhere."""

    def __init__(self, plain_interval: float = 2.0) -> None:
        self.terminal = sys.stdout.isatty()
        self.plain_interval = plain_interval
        self._last_line = 0.0
        self._last_phase = ""
        self._started = time.monotonic()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> _Display:
        if self.terminal:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[detail]}"))
            self._bar.start()
            self._task = self._bar.add_task("", total=None, detail="")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def show(self, phase: str, detail: str, completed: float | None, total: float | None,
             plain: str, final: bool = False) -> None:
        """Draws the bar (`total` None: an indeterminate phase) or prints `plain` (if any) when
        the phase changed or `plain_interval` passed."""
        if self._bar is not None:
            self._bar.update(self._task, description=phase, detail=detail,
                             completed=completed or 0, total=total)
            if final:
                self._bar.refresh()
            return
        now = time.monotonic()
        if plain and (final or phase != self._last_phase
                      or now - self._last_line >= self.plain_interval):
            self._last_line = now
            self._last_phase = phase
            print(plain, flush=True)


class WarmupProgress(_Display):
    def update(self, state: dict[str, Any], final: bool = False) -> None:
        planned = state["bytes_total"] - state["bytes_skipped_for_space"]
        loaded = state["bytes_done"] + state["bytes_already_cached"]
        if final and state["state"] == "done":
            loaded = planned
        if state["state"] == "planning":
            found = state["files_total"]
            detail = "listing files and checking what is cached" + (
                f": {found} files so far" if found else "")
            self.show("listing", detail, None, None, f"warmup {state['id']}: {detail}", final)
            return
        detail = warmup_detail(state, loaded, self.elapsed)
        plain = "" if final else f"warmup {state['id']}: {state['state']}, {detail}"
        self.show("warmup", detail, loaded, max(planned, 1) if planned or final else None,
                  plain, final)


def warmup_detail(state: dict[str, Any], loaded: int, elapsed: float) -> str:
    rate = state["bytes_done"] / elapsed if elapsed > 0 else 0.0
    remaining = state["bytes_total"] - state["bytes_skipped_for_space"] - loaded
    eta = "0s" if remaining <= 0 else f"{remaining / rate:.0f}s" if rate > 0 else "?"
    files = state["files_done"] + state["files_already_cached"]
    return (f"{files}/{state['files_total']} files, {format_size(loaded)}/"
            f"{format_size(state['bytes_total'])}, {format_size(rate)}/s, ETA {eta}")


class FlushProgress(_Display):
    """Pending uploads going down to none; the bar's total is the most dirty bytes seen."""

    def __init__(self, plain_interval: float = 0.0) -> None:
        super().__init__(plain_interval)
        self._most = 0
        self.shown = False

    def update(self, dirty: dict[str, Any], final: bool = False) -> None:
        self.shown = True
        self._most = max(self._most, dirty["bytes"])
        if final and not dirty["upload_queue"]:
            detail = "everything is in the store"
        else:
            detail = (f"{dirty['upload_queue']} changes pending, {format_size(dirty['bytes'])} "
                      f"dirty, {dirty['uploading']} uploading")
        self.show("flush", detail, self._most - dirty["bytes"], max(self._most, 1),
                  f"flush: {detail}", final)


def summary(state: dict[str, Any]) -> str:
    elapsed = (state["finished_at"] or time.time()) - state["started_at"]
    rate = state["bytes_done"] / elapsed if elapsed > 0 else 0.0
    text = (f"warmup {state['id']} {state['state']}: {state['files_done']} files "
            f"({format_size(state['bytes_done'])}) loaded in {elapsed:.1f}s "
            f"({format_size(rate)}/s), {state['files_already_cached']} already cached")
    if state["files_skipped_for_space"]:
        text += (f", {state['files_skipped_for_space']} skipped: "
                 f"{format_size(state['bytes_skipped_for_space'])} did not fit in the "
                 f"{state['tier']} tier")
    if state["files_failed"]:
        text += f", {state['files_failed']} failed"
    return text
