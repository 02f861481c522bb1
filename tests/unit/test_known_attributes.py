"""KnownAttributes: what a listing is given back from earlier mounts, and when it is not."""

from __future__ import annotations

import dataclasses

from avafs.namespace.known_attributes import KnownAttributes, _record_key
from avafs.stores.base import ObjectInfo
from avafs.stores.metadata import Attrs

URL = "s3://bucket/"
LISTED = ObjectInfo("a/b.bin", 10, "etag1", 1000.5)
FOUND = dataclasses.replace(LISTED, mtime=900.0, attrs=Attrs(mode=0o600, uid=7))


def test_a_version_read_before_is_given_back_with_its_attributes(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    known.remember(URL, LISTED.key, LISTED, FOUND)
    known.close()
    known = KnownAttributes(tmp_path / "attributes")
    other = ObjectInfo("a/c.bin", 3, "etag2", 5.0)
    assert known.recall(URL, [LISTED, other]) == [FOUND, other]
    assert known.recall("s3://another/", [LISTED]) == [LISTED]


def test_another_etag_or_write_time_is_not_given_the_record(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    known.remember(URL, LISTED.key, LISTED, FOUND)
    replaced = dataclasses.replace(LISTED, etag="etag9")
    changed_in_place = dataclasses.replace(LISTED, mtime=1001.5)
    assert known.recall(URL, [replaced, changed_in_place]) == [replaced, changed_in_place]


def test_what_a_head_found_of_a_newer_version_is_not_recorded_for_the_listed_one(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    known.remember(URL, LISTED.key, LISTED, dataclasses.replace(FOUND, etag="etag9"))
    assert known.recall(URL, [LISTED]) == [LISTED]


def test_an_uploaded_version_pins_the_write_time_of_its_first_listing(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    known.remember(URL, LISTED.key, None, FOUND)
    assert known.recall(URL, [LISTED]) == [FOUND]
    later_copy = dataclasses.replace(LISTED, mtime=2000.0)
    assert known.recall(URL, [later_copy]) == [later_copy]


def test_a_deleted_key_loses_its_record_and_a_torn_record_is_ignored(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    known.remember(URL, LISTED.key, LISTED, FOUND)
    known.remember(URL, LISTED.key, None, None)
    assert known.recall(URL, [LISTED]) == [LISTED]
    known.remember(URL, "never/recorded", None, None)
    known._records[_record_key(URL, LISTED.key)] = b'{"etag": "etag1"'
    assert known.recall(URL, [LISTED]) == [LISTED]


def test_objects_listed_with_attributes_are_left_as_they_are(tmp_path):
    known = KnownAttributes(tmp_path / "attributes")
    assert known.recall(URL, [FOUND]) == [FOUND]
