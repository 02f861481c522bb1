"""The one exception type whose message is shown to users as is.

Every failure a user can fix (bad flag, missing bucket, wrong credentials, busy mountpoint) is
raised as `AvafsError` with a one-line message that names the problem and what to do; the CLI
prints it and exits non-zero. Anything else is a bug and keeps its traceback in the log.
"""

NEW_OBJECTS_HINT = ("objects created in the store since the mount listed their directory appear "
                    "after --metadata-ttl seconds; 'avafs refresh PATH' shows them now")
"""Said wherever a path is not found in a mount, since a new object is the usual reason."""


class AvafsError(Exception):
    """A user-facing, one-line error."""


class StoreError(AvafsError):
    """The object store refused or failed a request after retries.

    `permanent` tells a refusal that repeating the same request cannot change (a 4xx such as
    access denied or a key the store does not accept) from a failure that may pass (5xx,
    timeouts, resets, an unreachable endpoint): write-back sets a permanently refused upload
    aside instead of retrying it forever."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class ObjectChangedError(StoreError):
    """The object's ETag no longer matches the version being read.

    Raised instead of mixing blocks of two versions into one read.
    """


class SnapshotVersionGone(StoreError):
    """A file of a snapshot whose recorded version neither the store nor any tier has any
    more. Its raiser has logged it once already: it is answered EIO with no further line, as
    a reader's retries of the same read would repeat it."""
