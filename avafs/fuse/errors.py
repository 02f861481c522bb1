"""No request ends the daemon: every failure under a handler becomes the errno its caller gets.

pyfuse3 ends its main loop, and with it the mount for every user, on any exception out of a
request handler but FUSEError. `guarded` wraps every handler of the operations class so that
none can escape; the handlers keep their own checks and their own ordering of side effects
(what was changed before a failure is undone there), this is the last line.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
from collections.abc import Iterator

import pyfuse3

from ..errors import ObjectChangedError, SnapshotVersionGone, StoreError
from ..namespace import Refused

log = logging.getLogger(__name__)

REFUSALS = frozenset({errno.EFBIG, errno.ENAMETOOLONG, errno.EINVAL, errno.EEXIST,
                      errno.ENOENT, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR, errno.EPERM,
                      errno.EACCES})
"""What the local disk answers a request it refuses as asked (a size past what it holds):
the caller's mistake, not the disk's failure, so not an error of the daemon's log."""

HANDLERS = frozenset(name for name, value in vars(pyfuse3.Operations).items()
                     if callable(value) and not name.startswith("_")
                     and name not in ("init", "stacktrace"))
"""The methods pyfuse3 calls for kernel requests."""


def errno_of(error: Exception) -> int:
    """A failure of the local disk or the store as the errno the caller gets. One that is
    none of these is a bug: logged with its traceback, answered EIO."""
    if isinstance(error, Refused):
        return error.errno
    if isinstance(error, OSError):
        log.log(logging.INFO if error.errno in REFUSALS else logging.ERROR, "%s", error)
        return error.errno or errno.EIO
    if isinstance(error, SnapshotVersionGone):
        return errno.EIO
    if isinstance(error, ObjectChangedError):
        log.warning("%s", error)
        return errno.ESTALE
    if isinstance(error, StoreError):
        log.error("%s", error)
        return errno.EIO
    log.error("a request failed unexpectedly; answered EIO", exc_info=error)
    return errno.EIO


@contextlib.contextmanager
def as_fuse_error() -> Iterator[None]:
    """`errno_of` for a block of a handler."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except Exception as error:
        raise pyfuse3.FUSEError(errno_of(error)) from None


def guarded(operations: type[pyfuse3.Operations]) -> type[pyfuse3.Operations]:
    """Every request handler of the class, wherever in its bases it is defined, answered
    through `errno_of`, so that no request, whatever fails under it, can end the daemon."""
    for name in HANDLERS:
        handler = getattr(operations, name)
        if handler is getattr(pyfuse3.Operations, name):
            continue  # pyfuse3's own answer (ENOSYS)

        @functools.wraps(handler)
        async def guarded_handler(*args: object, _handler=handler, **kwargs: object) -> object:
            try:
                return await _handler(*args, **kwargs)
            except pyfuse3.FUSEError:
                raise
            except Exception as error:
                raise pyfuse3.FUSEError(errno_of(error)) from None

        setattr(operations, name, guarded_handler)
    return operations
