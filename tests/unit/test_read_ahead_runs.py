"""What the directory read-ahead takes for files read in order (avafs/fuse/read_ahead.py's
`_Run`): several readers taking a directory's files in turn, not a shuffled reader."""

from __future__ import annotations

import random
import weakref

from avafs.fuse.read_ahead import JITTER, TRIGGER, _Run
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
