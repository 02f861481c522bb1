"""What changed between two snapshots of one source: files added, removed, and changed
(another ETag, so other bytes), with their sizes."""

from __future__ import annotations

from dataclasses import dataclass

from .record import RecordedFile, Snapshot


@dataclass(frozen=True, slots=True)
class Difference:
    added: list[RecordedFile]
    removed: list[RecordedFile]
    changed: list[tuple[RecordedFile, RecordedFile]]
    """(in the first, in the second) of each key whose ETag differs."""

    def as_dict(self) -> dict:
        return {"added": [[file.key, file.size] for file in self.added],
                "removed": [[file.key, file.size] for file in self.removed],
                "changed": [[old.key, old.size, new.size] for old, new in self.changed]}


def diff(first: Snapshot, second: Snapshot) -> Difference:
    before = {file.key: file for file in first.files}
    after = {file.key: file for file in second.files}
    return Difference(
        added=[file for key, file in after.items() if key not in before],
        removed=[file for key, file in before.items() if key not in after],
        changed=[(before[key], file) for key, file in after.items()
                 if key in before and before[key].etag != file.etag])
