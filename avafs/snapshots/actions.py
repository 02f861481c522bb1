"""The `avafs snapshot` commands on one source's catalog, as JSON-ready answers: run by the
CLI itself for a bucket URL, and by the daemon (the `snapshot` control operation) for a path
in a mount, which first uploads what was written under it."""

from __future__ import annotations

from typing import Any

from ..errors import AvafsError
from .catalog import SnapshotCatalog
from .diff import diff

ACTIONS = ("create", "list", "delete", "diff")


def perform(catalog: SnapshotCatalog, request: dict[str, Any], prefix: str = "") -> dict:
    """`request`: `action` and its fields (`name`; diff's `names`, two of them)."""
    action = request.get("action")
    if action == "create":
        return {"created": catalog.create(request["name"], prefix).as_dict()}
    if action == "list":
        return {"source": catalog.store.url,
                "snapshots": [summary.as_dict() for summary in catalog.summaries()]}
    if action == "delete":
        return {"deleted": catalog.delete(request["name"]).as_dict()}
    if action == "diff":
        first, second = (catalog.load(name) for name in request["names"])
        return diff(first, second).as_dict()
    raise AvafsError(f"unknown snapshot action {action!r}: use one of {', '.join(ACTIONS)}")
