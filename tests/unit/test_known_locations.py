"""What lets a reader skip the daemon: the daemon's generation counter (`InPlaceWatch`), a
reader's table of remembered locations (`KnownLocations`) and the daemon's snapshot of answers
(`LocationSnapshot`) over the same files, without a mount; tests/mount/test_file_reads.py covers the
same through real mounts."""

from __future__ import annotations

import time

import pytest

from avafs.batch_reads.generation import InPlaceWatch
from avafs.batch_reads.snapshot import LocationSnapshot
from avafs.config.cache_dir import LOCATIONS_FILE
from avafs.reader import known_locations as known_module
from avafs.reader.known_locations import known_locations

ANSWER = {"data/a.bin": ("disk/blocks/ab/abcd", 10)}


@pytest.fixture
def watch(tmp_path):
    watch = InPlaceWatch(tmp_path)
    watch.watch([("", "data/")], [("", ""), ("", "data/")])
    yield watch
    watch.close()


def remembered(tmp_path, watch: InPlaceWatch):
    table = known_locations(str(tmp_path))
    table.begin()
    table.keep(watch.generation, ANSWER, 60.0, now=0.0)
    return table


def test_only_changes_that_can_alter_an_answer_move_the_generation(tmp_path, watch):
    table = remembered(tmp_path, watch)
    for unrelated in ("logs/step.log", "logs/", "other.bin", "data2/x", "dat"):
        watch.changed("", unrelated)
    watch.changed("second-source", "data/a.bin")
    table.begin()
    assert table.get("data/a.bin", now=1.0) == ("disk/blocks/ab/abcd", 10)

    for relevant in ("data/new.bin", "data/", "data"):
        table = remembered(tmp_path, watch)
        watch.changed("", relevant)
        table.begin()
        assert table.get("data/a.bin", now=1.0) is None, relevant


def test_an_answer_is_kept_only_under_the_generation_in_force_and_for_as_long_as_it_says(
        tmp_path, watch):
    table = known_locations(str(tmp_path))
    table.begin()
    table.keep(watch.generation + 1, ANSWER, 60.0, now=0.0)
    assert table.get("data/a.bin", now=1.0) is None, "resolved under another generation"
    table.keep(watch.generation, ANSWER, 0.0, now=0.0)
    assert table.get("data/a.bin", now=0.0) is None, "the daemon allowed no keeping"
    table.keep(watch.generation, ANSWER, 5.0, now=0.0)
    assert table.get("data/a.bin", now=4.9) is not None
    assert table.get("data/a.bin", now=5.0) is None
    table.forget("data/a.bin")
    assert table.get("data/a.bin", now=1.0) is None


def test_a_stopped_or_restarted_daemon_invalidates_everything(tmp_path):
    first = InPlaceWatch(tmp_path)
    table = remembered(tmp_path, first)
    first.close()
    first.changed("", "data/a.bin")  # an upload settling during shutdown
    table.begin()
    assert table.get("data/a.bin", now=1.0) is None
    table.keep(table.begin(), ANSWER, 60.0, now=0.0)
    assert table.get("data/a.bin", now=1.0) is None, "nothing is kept under a stopped daemon"

    second = InPlaceWatch(tmp_path)
    try:
        assert table.begin() == second.generation != first.generation
    finally:
        second.close()


def test_the_table_stops_growing_at_its_cap(tmp_path, watch, monkeypatch):
    monkeypatch.setattr(known_module, "MAX_LOCATIONS", 2)
    table = known_locations(str(tmp_path))
    table.begin()
    answers = {f"data/{index}": (f"disk/blocks/{index}", 1) for index in range(4)}
    table.keep(watch.generation, answers, 60.0, now=0.0)
    assert [table.get(f"data/{index}", now=1.0) is not None for index in range(4)] == \
        [True, True, False, False]
    table.keep(watch.generation, {"data/0": ("disk/blocks/new", 1)}, 60.0, now=0.0)
    assert table.get("data/0", now=1.0) == ("disk/blocks/new", 1)


def test_no_table_where_the_daemon_keeps_no_generation(tmp_path):
    assert known_locations(str(tmp_path / "old-daemon")) is None


def taken_up(table) -> bool:
    """Loads the daemon's snapshot as a reader that misses does, once its writer has caught up."""
    deadline = time.monotonic() + 5
    while not table.load_snapshot(time.monotonic()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_reader_takes_up_answers_given_to_others_under_the_same_generation(tmp_path, watch):
    snapshot = LocationSnapshot(tmp_path / LOCATIONS_FILE)
    table = known_locations(str(tmp_path))
    table.begin()
    now = time.monotonic()
    snapshot.add(watch.generation, ANSWER, until=now + 60)
    snapshot.add(watch.generation, {"data/old.bin": ("disk/blocks/ef/ef01", 3)}, until=now)
    assert table.get("data/a.bin", now) is None
    assert taken_up(table)
    assert table.get("data/a.bin", time.monotonic()) == ("disk/blocks/ab/abcd", 10)
    assert table.get("data/old.bin", time.monotonic()) is None, "expired: not taken up"
    assert not table.load_snapshot(time.monotonic() + 1), "unchanged since: not read again"

    watch.changed("", "data/new.bin")
    table.begin()
    assert table.get("data/a.bin", time.monotonic()) is None
    assert not table.load_snapshot(time.monotonic()), "written under the generation before"
    snapshot.add(watch.generation, {"data/new.bin": ("disk/blocks/cd/cd01", 5)},
                 until=time.monotonic() + 60)
    assert taken_up(table)
    assert table.get("data/new.bin", time.monotonic()) == ("disk/blocks/cd/cd01", 5)
    assert table.get("data/a.bin", time.monotonic()) is None, "the older generation is dropped"

    snapshot.close()
    assert not (tmp_path / LOCATIONS_FILE).exists()
