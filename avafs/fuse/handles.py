"""What an open file and an open directory hold between their requests."""

from __future__ import annotations

from dataclasses import dataclass

from ..namespace import Entry, Node
from ..objects import ObjectRef
from ..tiers.readahead import ReadAhead
from ..writeback.pending import Pending


@dataclass(slots=True)
class OpenFile:
    """A handle reads cached blocks of an object version (`ref`), or a local dirty file
    (`fd`), which writers always use."""

    inode: int
    ref: ObjectRef | None = None
    fd: int = -1
    pending: Pending | None = None
    writable: bool = False
    read_ahead: ReadAhead | None = None
    """The tier stack's read-ahead state for this reader of `ref`."""


@dataclass(slots=True)
class OpenDirectory:
    node: Node
    entries: list[Entry] | None = None
    """The listing this handle pages through, fixed at its first readdir for consistency."""

