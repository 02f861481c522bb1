"""The answers of `avafs snapshot` (actions.py) as text for people."""

from __future__ import annotations

import time

from ..config.sizes import format_size


def _age(created: float) -> str:
    seconds = max(0, int(time.time() - created))
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


def _summary_line(summary: dict) -> str:
    where = f" of {summary['prefix']}" if summary["prefix"] else ""
    pinned = "versions" if summary["versioned"] else "ETags"
    return (f"snapshot {summary['name']}{where}: {summary['files']} files, "
            f"{format_size(summary['bytes'])}, pinned by {pinned}")


def format_answer(action: str, answer: dict) -> str:
    if action == "create":
        return _summary_line(answer["created"])
    if action == "delete":
        return f"deleted {_summary_line(answer['deleted'])}"
    if action == "list":
        rows = [("NAME", "FILES", "SIZE", "AGE", "PINNED BY", "PREFIX")]
        rows += [(summary["name"], str(summary["files"]), format_size(summary["bytes"]),
                  _age(summary["created"]), "versions" if summary["versioned"] else "ETags",
                  summary["prefix"] or "/") for summary in answer["snapshots"]]
        if len(rows) == 1:
            return f"{answer['source']} has no snapshots"
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                             strict=True))
                         .rstrip() for row in rows)
    lines = [f"+ {key} ({format_size(size)})" for key, size in answer["added"]]
    lines += [f"- {key} ({format_size(size)})" for key, size in answer["removed"]]
    lines += [f"~ {key} ({format_size(old)} -> {format_size(new)})"
              for key, old, new in answer["changed"]]
    lines.append(f"{len(answer['added'])} added, {len(answer['removed'])} removed, "
                 f"{len(answer['changed'])} changed")
    return "\n".join(lines)
