"""Every file a document or a docstring points to exists in the repository.

What is checked:
- README.md, BENCHMARKS.md and docs/*.md: every relative Markdown link `[text](target)`
  (resolved against the document's directory, `#anchor` dropped), and every word of inline
  code (`...`) and of fenced code blocks that names a repository path.
- Docstrings and comments of avafs/: every word that names a repository path, backticked or
  not.

A word names a repository path when it starts with one of the repository's top-level
directories and a slash (`avafs/tiers/stack.py`, `bench/probes.py`, `docs/`), or when it is a
file name ending in `.py` or `.md` (`frequency.py`, `BENCHMARKS.md`). The first must exist
relative to the repository root (a `.md` word also relative to the document that names it);
a bare file name must be the name of some file in the repository.

Examples, not paths, by this exact rule: a word that starts with `/` or `~` (`/tmp/trace`,
`/proc/self/fd`), or contains `*`, `?`, `{`, `}`, `<`, `>`, `$` or `...`, or has a path segment
written as a placeholder in capitals (`MNT`, `DIR`, `XX`, `CACHE_DIR`: only capital letters,
digits and underscores, at least two characters, and not a file name with an extension).
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = sorted(path.name for path in ROOT.iterdir()
                   if path.is_dir() and not path.name.startswith("."))
DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted((ROOT / "avafs").rglob("*.py"))

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_WORD = re.compile(r"[\w./~*?{}<>$-]+")
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]+")
_EXAMPLE_MARKS = ("*", "?", "{", "}", "<", ">", "$", "...")


def _all_file_names() -> set[str]:
    """Names of the repository's files, not of those in hidden folders: .git, and .venv, the
    install's environment, whose thousands of files would name anything."""
    names = set()
    for _, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        names.update(files)
    return names


FILE_NAMES = _all_file_names()


def _is_example(word: str) -> bool:
    return word.startswith(("/", "~")) or any(mark in word for mark in _EXAMPLE_MARKS) or \
        any(_PLACEHOLDER.fullmatch(segment) for segment in word.split("/"))


def repository_paths(text: str) -> list[str]:
    """The words of `text` that name repository paths (see the module's docstring)."""
    found = []
    for raw in _WORD.findall(text):
        word = raw.rstrip(".,:;")
        if not word or _is_example(raw):
            continue
        if word.split("/", 1)[0] in TOP_LEVEL if "/" in word else \
                re.fullmatch(r"[\w.-]+\.(py|md)", word):
            found.append(word)
    return found


def _exists(word: str, relative_to: Path) -> bool:
    if "/" not in word:
        return word in FILE_NAMES
    if (ROOT / word).exists():
        return True
    return word.endswith(".md") and (relative_to / word).exists()


def _link_target(target: str) -> str | None:
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return None  # a URL (http:, mailto:, ...) or an anchor in the same document
    return target.split("#", 1)[0] or None


def document_problems(document: Path) -> list[str]:
    text = document.read_text()
    problems = []
    for target in _LINK.findall(text):
        path = _link_target(target)
        if path is not None and not (document.parent / path).exists():
            problems.append(f"link ({target})")
    code = _INLINE_CODE.findall(_FENCE.sub("", text)) + _FENCE.findall(text)
    for span in code:
        for word in repository_paths(span):
            if not _exists(word, document.parent):
                problems.append(f"`{word}`")
    return problems


def _docstrings_and_comments(source: Path) -> list[str]:
    text = source.read_text()
    pieces = [node.value.value for node in ast.walk(ast.parse(text))
              if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)]
    pieces += [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
               if token.type == tokenize.COMMENT]
    return pieces


def source_problems(source: Path) -> list[str]:
    return [word for piece in _docstrings_and_comments(source)
            for word in repository_paths(piece) if not _exists(word, source.parent)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_document_paths_exist(document: Path) -> None:
    assert document_problems(document) == [], f"{document.name} names missing files"


def test_docstring_paths_exist() -> None:
    problems = {str(source.relative_to(ROOT)): found for source in SOURCES
                if (found := source_problems(source))}
    assert problems == {}, "docstrings or comments name missing files"


def test_the_rule_catches_what_it_should() -> None:
    assert repository_paths("see `avafs/tiers/missing.py` and DESIGN.md.") == [
        "avafs/tiers/missing.py", "DESIGN.md"]
    assert repository_paths("/tmp/x.py MNT/a.md bench/*.py avafs/XX/NAME tests/...") == []
    assert not _exists("DESIGN.md", ROOT)
    assert _exists("docs/ARCHITECTURE.md", ROOT) and _exists("stack.py", ROOT)
