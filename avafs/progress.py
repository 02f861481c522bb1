"""Warmup and flush progress for people: a bar on a terminal, plain periodic lines in logs.

Peers' warmups show nothing for hours (Fluid, Alluxio reports); ours always says how far it got.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .sizes import format_size


class WarmupProgress:
    def __init__(self, plain_interval: float = 2.0) -> None:
        self.terminal = sys.stdout.isatty()
        self.plain_interval = plain_interval
        self._last_line = 0.0
        self._started = time.monotonic()
        self._bar: Progress | None = None
        self._files_task = self._bytes_task = None

    def __enter__(self) -> WarmupProgress:
        if self.terminal:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), DownloadColumn(), TransferSpeedColumn(),
                                 TimeRemainingColumn())
            self._bar.start()
            self._files_task = self._bar.add_task("files", total=None)
            self._bytes_task = self._bar.add_task("bytes", total=None)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, state: dict[str, Any]) -> None:
        files = state["files_done"] + state["files_already_cached"]
        data = state["bytes_done"] + state["bytes_already_cached"]
        if self._bar is not None:
            self._bar.update(self._files_task, completed=files, total=state["files_total"])
            self._bar.update(self._bytes_task, completed=data, total=state["bytes_total"])
            return
        now = time.monotonic()
        if now - self._last_line < self.plain_interval:
            return
        self._last_line = now
        print(plain_line(state, now - self._started), flush=True)


def plain_line(state: dict[str, Any], elapsed: float) -> str:
    rate = state["bytes_done"] / elapsed if elapsed > 0 else 0.0
    remaining = state["bytes_total"] - state["bytes_done"] - state["bytes_already_cached"] \
        - state["bytes_skipped_for_space"]
    eta = f"{remaining / rate:.0f}s" if rate > 0 else "?"
    return (f"warmup {state['id']}: {state['state']}, "
            f"{state['files_done'] + state['files_already_cached']}/{state['files_total']} files, "
            f"{format_size(state['bytes_done'] + state['bytes_already_cached'])}/"
            f"{format_size(state['bytes_total'])}, {format_size(rate)}/s, ETA {eta}")


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
