"""docs/ARCHITECTURE.md's lock table names every lock, condition, event and semaphore of avafs.

The table is where a reader learns what each one guards and what may be taken under it; one
added to the code without a row is one whose rules nobody wrote down. Found here: every
attribute (`self.NAME = threading.Lock()`, ...) and module global assigned one of these, by
its class; a row names it as `Class.name`, or a row of that class lists `name` after it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore"}


def _made_here(value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call):
        return False
    function = value.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return name in KINDS


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign) and _made_here(node.value):
        return node.targets
    if isinstance(node, ast.AnnAssign) and _made_here(node.value):
        return [node.target]
    return []


def synchronisation_objects() -> set[str]:
    """`Class.attribute` or `global` of every one made in avafs/."""
    found = set()
    for path in sorted((ROOT / "avafs").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            found.update(target.id for target in _assigned(node) if isinstance(target, ast.Name))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for node in ast.walk(cls):
                found.update(f"{cls.name}.{target.attr}" for target in _assigned(node)
                             if isinstance(target, ast.Attribute))
    return found


def lock_table() -> str:
    document = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    return document[document.index("## Locks"):document.index("The nesting that")]


def test_every_lock_has_a_row_in_the_lock_table():
    table = lock_table()
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    missing = []
    for name in sorted(synchronisation_objects()):
        owner, _, attribute = name.rpartition(".")
        named = any(f"`{name}`" in row or (owner and f"`{owner}." in row and re.search(
            rf"`{re.escape(attribute)}`", row)) for row in rows)
        if not named:
            missing.append(name)
    assert not missing, f"add rows to docs/ARCHITECTURE.md's lock table for {missing}"


def test_the_scan_finds_the_locks_it_is_meant_to():
    """Guards the other test against passing on a scan that finds nothing."""
    assert {"WriteBack.lock", "Namespace._lock", "DiskTier._closing",
            "Deadlines._changed"} <= synchronisation_objects()
