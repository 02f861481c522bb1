"""What the directory read-ahead takes for files read in order (avafs/fuse/read_ahead.py's
`_Run`): several readers taking a directory's files in turn, or each walking a part of its
own, not a shuffled reader."""

from __future__ import annotations

import random
import weakref

from avafs.fuse.read_ahead import JITTER, READERS, TRIGGER, _Run
from avafs.namespace.listings import CachedListing

LISTING = CachedListing(0.0)


def _run() -> _Run:
    return _Run(weakref.ref(LISTING), [])


def _notes(positions: list[int]) -> list[bool]:
    run = _run()
    return [run.note(position) for position in positions]


def test_one_reader_in_order_is_followed_from_the_trigger_on():
    assert _notes(list(range(20))) == [False] * (TRIGGER - 1) + [True] * (21 - TRIGGER)


def test_eight_readers_taking_files_in_turn_are_in_order():
    rng = random.Random(3)
    positions = []
    for start in range(0, 400, 8):
        group = list(range(start, start + 8))
        rng.shuffle(group)
        positions += group
    notes = _notes(positions)
    assert not any(notes[:TRIGGER - 1])
    assert all(notes[8:])


def test_a_shuffled_reader_is_not_in_order():
    triggered = 0
    for seed in range(200):
        positions = list(range(100))
        random.Random(seed).shuffle(positions)
        triggered += any(_notes(positions))
    assert triggered <= 2


def test_a_file_looked_up_again_counts_once():
    run = _run()
    for position in range(TRIGGER - 1):
        assert not run.note(position)
        assert not run.note(position)
    assert run.note(TRIGGER - 1)


def test_a_jump_starts_a_new_run_and_an_earlier_file_of_the_run_changes_nothing():
    run = _run()
    for position in range(40):
        run.note(position)
    assert run.note(3)
    assert (run.first, run.furthest, run.lookups) == (0, 39, 40)
    jump = 39 + JITTER + 1
    assert not run.note(jump)
    assert (run.first, run.furthest, run.lookups, run.fetched_to) == (jump, jump, 1, jump + 1)


def test_readers_each_in_a_part_of_their_own_are_each_in_order_where_together_they_are_not():
    directory = _run()
    parts = [list(range(start, start + 25)) for start in range(0, 100, 25)]
    together, each = [], {reader: [] for reader in range(4)}
    for step in range(25):
        for reader, part in enumerate(parts):
            together.append(directory.note(part[step]))
            each[reader].append(directory.reader(reader).note(part[step]))
    assert not any(together)
    assert all(notes == [False] * (TRIGGER - 1) + [True] * (26 - TRIGGER)
               for notes in each.values())


def test_a_directory_keeps_the_runs_of_its_last_readers_over_its_names():
    directory = _Run(weakref.ref(LISTING), ["a", "b"])
    first = directory.reader(1)
    assert first.names is directory.names and first.listing() is LISTING
    assert directory.reader(1) is first
    for reader in range(2, READERS + 2):
        directory.reader(reader)
    assert list(directory.readers) == list(range(2, READERS + 2))
    assert directory.reader(1) is not first
