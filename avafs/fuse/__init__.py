"""The FUSE face of a mount: `AvafsOperations` (operations.py) and the rooms its handlers live
in. See operations.py's docstring for the map."""

from .operations import AvafsOperations

__all__ = ["AvafsOperations"]
