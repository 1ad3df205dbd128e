"""Exceptions raised by trackpoint.

Everything trackpoint raises on purpose is a :class:`CheckpointError`::

    CheckpointError
    ├── NotFoundError          (also FileNotFoundError)  a checkpoint, file or key is missing
    ├── DataLossError          (also OSError)            bytes on disk are damaged or truncated
    ├── InvalidArgumentError   (also ValueError)         bad input: dtype, shape, name, option
    ├── FailedPreconditionError (also RuntimeError)      an operation called in the wrong state
    └── CollectiveError                                  ranks of a distributed job lost each other

Each error carries the ``path`` and ``key`` it is about (``None`` when not applicable), so
callers can react without parsing messages. Messages say what happened, where, and what to do.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CollectiveError",
    "DataLossError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
]


class CheckpointError(Exception):
    """Root of every error trackpoint raises on purpose."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.key = key

    def __str__(self) -> str:
        return self.message


class NotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint, data file, state file or checkpoint key does not exist."""


class DataLossError(CheckpointError, OSError):
    """Stored bytes are corrupt or truncated: a checksum mismatch, a short read, bad structure."""


class InvalidArgumentError(CheckpointError, ValueError):
    """The caller passed something trackpoint cannot accept (dtype, shape, name, option)."""


class FailedPreconditionError(CheckpointError, RuntimeError):
    """An operation was called in a state that does not allow it (e.g. a writer finished twice)."""


class _StagingAborted(FailedPreconditionError):
    """The other side of an async save's staging stopped (the write failed, or copying did).

    Private: a signal inside the saving layer, raised by the stager (saving/staging.py) on the
    thread copying values into the staging buffer or on the thread writing them, and passing
    through the saver to the async writer; users never see it: the save reports the error
    that stopped it.
    """


class CollectiveError(CheckpointError):
    """An exchange between the ranks of a distributed job failed.

    A rank died, or did not take part in time (``timeout``); the other ranks raise this instead
    of waiting forever.
    """
