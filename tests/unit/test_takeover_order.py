"""The order a take-over applies a lost node's records in (`takeover._copies_first`): each copy
ahead of whatever deletes or replaces the key it reads, whatever order the records were made
in; copies that read each other's keys in a cycle come out once each, and those of them that
come after their source's replacement are the ones staged as the data they copy first
(`_copies_of_replaced_keys`)."""

from __future__ import annotations

from avafs.writeback.cluster.queue import Record
from avafs.writeback.cluster.takeover import _copies_first, _copies_of_replaced_keys
from avafs.writeback.pending import COPY, DATA, DELETED

ORIGIN = "file:///origin"


def record(number: int, key: str, kind: str = DATA, copy_from: str | None = None) -> Record:
    return Record(f"{number:020d}-t{number}", ORIGIN, key, 10, 0.0, None, kind, copy_from,
                  None if copy_from is None else "etag")


def keys(records: list[Record]) -> list[str]:
    return [f"{each.kind}:{each.key}" for each in records]


def test_a_copy_staged_after_its_sources_deletion_goes_first():
    records = [record(1, "one", DELETED), record(2, "other"), record(3, "renamed", COPY, "one")]
    assert keys(_copies_first(records)) == ["copy:renamed", "deleted:one", "data:other"]


def test_copies_go_ahead_of_the_copy_that_replaces_their_source_and_so_on():
    """renamed <- one, one <- two, two <- three (each a rename onto the previous source), made
    newest first: applied from the end of the chain back."""
    records = [record(1, "three", DELETED), record(2, "two", COPY, "three"),
               record(3, "one", COPY, "two"), record(4, "renamed", COPY, "one")]
    assert keys(_copies_first(records)) == ["copy:renamed", "copy:one", "copy:two",
                                            "deleted:three"]


def test_record_order_holds_where_no_copy_reads_a_key():
    records = [record(1, "a", DELETED), record(2, "b"), record(3, "c", COPY, "c")]
    assert _copies_first(records) == records


def test_copies_that_read_each_others_keys_come_out_once_each():
    records = [record(1, "a", COPY, "b"), record(2, "b", COPY, "a"), record(3, "t", DELETED)]
    ordered = _copies_first(records)
    assert sorted(keys(ordered)) == sorted(keys(records))
    assert keys(ordered) == ["copy:b", "copy:a", "deleted:t"]


def test_the_copy_of_a_cycle_that_comes_after_its_sources_replacement_is_named():
    records = [record(1, "a", COPY, "b"), record(2, "b", COPY, "a"), record(3, "t", DELETED)]
    assert keys(_copies_of_replaced_keys(_copies_first(records))) == ["copy:a"]


def test_no_copy_is_named_where_every_copy_goes_ahead_of_its_source():
    records = [record(1, "three", DELETED), record(2, "two", COPY, "three"),
               record(3, "one", COPY, "two"), record(4, "same", COPY, "same")]
    assert _copies_of_replaced_keys(_copies_first(records)) == []
