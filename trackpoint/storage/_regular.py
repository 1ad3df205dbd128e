"""Opening local files for reading: regular files only, never a call that can block.

A checkpoint directory is user-controlled input. ``open()`` on a FIFO waits for a writer that
may never come, a character device (``/dev/zero``) never ends, and a directory or socket fails
with errors that do not say what is wrong. Every local read (checkpoint index and data files,
the ``checkpoint`` state file, the lock record, the link-or-copy fallback) therefore opens
through :func:`open_regular`: ``O_NONBLOCK`` so the open itself returns at once whatever the
path is, then ``fstat`` on the opened descriptor (no window between a check and the open) and
``S_ISREG``, or a :class:`~trackpoint.errors.DataLossError` that names the path and what it is.

Symbolic links are followed, as TensorFlow's file system does: a link to a regular file reads
that file wherever it lives (refusing paths that leave a checkpoint directory is the state
file's business, not the storage's). A dangling link is a
:class:`~trackpoint.errors.NotFoundError`; a link loop a ``DataLossError``.
"""

from __future__ import annotations

import errno
import os
import stat

from trackpoint.errors import DataLossError, NotFoundError
from trackpoint.storage._errors import map_os_error

__all__ = ["describe_local_path", "file_kind", "not_regular_error", "open_regular"]

# O_NONBLOCK keeps open(2) of a FIFO without a writer from waiting; it changes nothing for
# regular files (Linux and macOS ignore it there). O_NOCTTY: a terminal never becomes ours.
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` describes, with its article: ``"a FIFO (named pipe)"``, ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def describe_local_path(path: str) -> str:
    """What ``path`` is, for messages: ``"a regular file"``, ``"a dangling symbolic link"``, ...

    Never opens ``path``, so it cannot block. Symbolic links are described by their target,
    except those that lead nowhere (``"a dangling symbolic link"``, ``"a symbolic link
    loop"``).
    """
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        if os.path.islink(path):
            return "a dangling symbolic link"
        if exc.errno == errno.ENOTDIR:
            return "a missing path (a parent is not a directory)"
        if exc.errno == errno.ENOENT:
            return "a missing path"
        return f"a path that cannot be examined ({exc.strerror or exc})"


def not_regular_error(path: str, kind: str, action: str) -> DataLossError:
    """The error for reading ``path``, which is ``kind`` (see :func:`file_kind`)."""
    return DataLossError(
        f"{path} is {kind}, not a regular file: refused while {action}. A checkpoint's files "
        "(index, data files, the `checkpoint` state file) must be regular files or symbolic "
        "links to them; replace it with the real file or remove it",
        path=path,
    )


def open_regular(path: str, action: str = "opening for read", *, name: str | None = None) -> int:
    """A read-only descriptor of the regular file at ``path`` (the caller closes it).

    Args:
        path: a local path; symbolic links are followed.
        action: the progressive verb for messages, e.g. ``"opening for read"``.
        name: how errors name the file (and their ``path``): the caller's spelling, e.g. a
            ``file://`` URL; default ``path``.

    Raises:
        NotFoundError: ``path`` does not exist (a dangling symbolic link included).
        DataLossError: ``path`` is not a regular file (FIFO, directory, socket, device), or a
            symbolic link loop.
        CheckpointError: any other ``OSError`` (permissions), naming ``path``.
    """
    shown = path if name is None else name
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_regular_error(shown, "a symbolic link loop", action) from exc
        if exc.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise not_regular_error(shown, describe_local_path(path), action) from exc
        if exc.errno == errno.EISDIR:
            raise not_regular_error(shown, "a directory", action) from exc
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise NotFoundError(
                f"{shown} is a dangling symbolic link (to {os.readlink(path)!r}, which does not "
                f"exist): nothing to read while {action}",
                path=shown,
            ) from exc
        raise map_os_error(exc, shown, action) from exc
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise map_os_error(exc, shown, action) from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular_error(shown, file_kind(mode), action)
    return fd
