"""Which request reads a file's attributes from its object: the LOOKUP itself where lookups in
one directory go side by side, else, for a file too large to be a link, the GETATTR after it.
The mounts in tests/mount run on the libfuse the install built, so the choice for an older
libfuse is checked here, on the handler alone."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from avafs.fuse import AvafsOperations, kernel
from avafs.stores.base import ObjectInfo


def _operations(size: int) -> tuple[AvafsOperations, list[object]]:
    """An AvafsOperations whose namespace lists one undescribed file of `size` bytes, and the
    list of the nodes whose attributes it read."""
    operations = object.__new__(AvafsOperations)
    info = ObjectInfo("file", size, "etag", 0.0)
    operations.namespace = SimpleNamespace(current_info=lambda node: info)
    operations.options = SimpleNamespace(listing_attrs=False)
    operations._opens = True
    described: list[object] = []

    async def info_with_attrs(node, reader=None):
        described.append(node)
        return info

    operations._info_with_attrs = info_with_attrs
    operations._attributes = lambda node: "attributes"
    return operations, described


@pytest.mark.parametrize(("parallel", "size", "read_by_lookup"), [
    (True, 8192, True), (True, 100, True), (False, 8192, False), (False, 100, True)])
def test_a_lookup_reads_the_attributes_unless_it_would_hold_the_directory(
        monkeypatch, parallel, size, read_by_lookup):
    monkeypatch.setattr(kernel, "PARALLEL_LOOKUPS", parallel)
    operations, described = _operations(size)
    node = SimpleNamespace(is_dir=False)
    assert asyncio.run(operations._described(node, lookup=True)) == "attributes"
    assert described == ([node] if read_by_lookup else [])
    described.clear()
    asyncio.run(operations._described(node))
    assert described == [node], "a GETATTR reads them"
