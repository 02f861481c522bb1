"""No request can end the daemon: every handler answers a failure under it with an errno.

pyfuse3 ends its main loop, and the mount for every user, on any exception from a handler
but FUSEError. These tests drive each handler with the errors the layers under it raise (the
mount tests in test_posix.py show the same for real requests)."""

from __future__ import annotations

import asyncio
import copy
import errno
import inspect

import pyfuse3
import pytest

from avafs.errors import ObjectChangedError, StoreError
from avafs.fuse import AvafsOperations
from avafs.fuse.errors import HANDLERS, errno_of
from avafs.namespace import Refused

FAILURES = [
    (OSError(errno.EFBIG, "File too large"), errno.EFBIG),
    (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    (OSError(errno.ENAMETOOLONG, "File name too long"), errno.ENAMETOOLONG),
    (Refused(errno.ENOTEMPTY, "not empty"), errno.ENOTEMPTY),
    (ObjectChangedError("changed while being read"), errno.ESTALE),
    (StoreError("the store refused"), errno.EIO),
    (KeyError(7), errno.EIO),
    (RuntimeError("a bug"), errno.EIO),
]


class _Failing:
    """A layer (or a table of open files) every use of which raises `error`."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def _fail(self, *args: object, **kwargs: object):
        raise self._error

    def __getattr__(self, name: str):
        return self._fail

    __getitem__ = __contains__ = __iter__ = _fail


def _arguments(handler) -> list[object]:
    """Plausible arguments by parameter name, as pyfuse3 passes them."""
    by_name = {"name": b"x", "name_old": b"x", "name_new": b"y", "new_name": b"y",
               "target": b"t", "buf": b"data", "attr": pyfuse3.EntryAttributes(),
               "fields": pyfuse3.SetattrFields(), "inode_list": [(5, 1)], "datasync": False,
               "token": None, "ctx": None, "value": b"v"}
    return [by_name.get(parameter, 5)
            for parameter in list(inspect.signature(handler).parameters)[1:]]


def _operations(error: Exception) -> AvafsOperations:
    operations = object.__new__(AvafsOperations)
    for layer in ("namespace", "writeback", "stack", "options", "_open", "_dirs", "_handles",
                  "_orphans", "_readers", "_built", "_kernel_listings", "_threads", "xattrs"):
        setattr(operations, layer, _Failing(error))
    operations._opens = True
    return operations


REFUSED_BEFORE_ANY_LAYER = {"link", "setxattr", "removexattr"}
"""Handlers that answer ENOTSUP whatever the layers would say."""


@pytest.mark.parametrize(("error", "expected"), FAILURES,
                         ids=[type(error).__name__ + str(getattr(error, "errno", "") or "")
                              for error, _ in FAILURES])
def test_every_handler_answers_a_failure_under_it_with_an_errno(error, expected):
    handlers = sorted(name for name in HANDLERS
                      if getattr(AvafsOperations, name) is not getattr(pyfuse3.Operations, name))
    assert {"setattr", "write", "create", "symlink", "readlink", "mknod", "rename"} <= \
        set(handlers)
    for name in handlers:
        handler = getattr(AvafsOperations, name)
        fresh = copy.copy(error)  # a traceback of its own for each call
        with pytest.raises(pyfuse3.FUSEError) as answered:
            asyncio.run(handler(_operations(fresh), *_arguments(handler)))
        wanted = errno.ENOTSUP if name in REFUSED_BEFORE_ANY_LAYER else expected
        assert answered.value.errno == wanted, name


@pytest.mark.parametrize(("error", "expected"), FAILURES)
def test_failures_map_to_the_errno_a_caller_can_act_on(error, expected):
    assert errno_of(error) == expected
