"""The import graph of `avafs`: layers call only downward, and no module imports itself back.

Every import counts, including those inside functions and those read only by type checkers:
a cycle through a type hint still means two modules cannot be understood or changed apart.
The layers are the data path of docs/ARCHITECTURE.md, top to bottom; a module may import
modules of lower layers, and modules of its own layer only inside its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "avafs"

LAYERS: list[list[str]] = [
    ["avafs.__main__", "avafs.mount_helper"],
    ["avafs.cli"],
    ["avafs.client"],
    ["avafs.daemon"],
    ["avafs.control"],
    ["avafs.fuse", "avafs.batch_reads", "avafs.warmup"],
    ["avafs.namespace"],
    ["avafs.writeback", "avafs.tiers"],
    ["avafs.objects"],
    ["avafs.snapshots"],
    ["avafs.stores"],
    ["avafs.reader"],
    ["avafs.config", "avafs.host"],
    ["avafs.errors", "avafs.log_format", "avafs.metrics", "avafs"],
]
"""Top to bottom. A module belongs to the entry that is the longest prefix of its name."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The avafs modules `name` imports, wherever in the file the import statement is."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("avafs"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("avafs"):
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in MODULES else target)
    return found - {name}


GRAPH = {name: imports_of(name) for name in MODULES}


def layer_entry(name: str) -> tuple[int, str]:
    matches = [(len(prefix), rank, prefix) for rank, layer in enumerate(LAYERS)
               for prefix in layer if name == prefix or name.startswith(prefix + ".")]
    assert matches, f"{name} is in no layer of LAYERS: add it where it belongs"
    _, rank, prefix = max(matches)
    return rank, prefix


def test_the_graph_is_the_package() -> None:
    """Guards the other tests against passing on an empty or misread graph."""
    assert {"avafs.fuse", "avafs.tiers.stack", "avafs.writeback.manager"} <= MODULES.keys()
    assert "avafs.tiers.stack" in GRAPH["avafs.daemon"]
    assert "avafs.objects" in GRAPH["avafs.tiers.stack"]


def test_every_import_resolves_to_a_module() -> None:
    unknown = {(name, target) for name, targets in GRAPH.items() for target in targets
               if target not in MODULES}
    assert not unknown


def test_layers_call_only_downward() -> None:
    upward = []
    for name, targets in GRAPH.items():
        rank, prefix = layer_entry(name)
        for target in targets:
            target_rank, target_prefix = layer_entry(target)
            if target_rank < rank or (target_rank == rank and target_prefix != prefix):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that do not go down a layer:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for target in sorted(GRAPH[name]):
            visit(target)
        path.pop()
        done.add(name)

    for name in sorted(GRAPH):
        visit(name)
