"""Translation of ``OSError`` into :mod:`trackpoint.errors` at the storage boundary.

Every backend funnels its ``OSError`` through :func:`map_os_error`, so callers above the storage
layer catch ``CheckpointError`` subclasses only, each carrying the ``path`` it is about (STYLE.md
§4, modelled on httpx's ``map_httpcore_exceptions``).
"""

from __future__ import annotations

import errno

from trackpoint.errors import CheckpointError, NotFoundError

__all__ = ["map_os_error"]

_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def map_os_error(
    exc: OSError, path: str, action: str, *, target: str | None = None
) -> CheckpointError:
    """Return the ``CheckpointError`` for ``exc``, raised while ``action``-ing ``path``.

    The caller raises the result ``from exc`` so the original error stays in the chain.

    Args:
        exc: the error the backend raised.
        path: the path the operation was about; kept on the returned exception.
        action: a verb in the progressive form for the message, e.g. ``"writing"``.
        target: the destination of a move, named after ``path`` ("renaming a to b").
    """
    if isinstance(exc, CheckpointError):
        return exc
    detail = exc.strerror or str(exc)
    where = f"{path} to {target}" if target else path
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return NotFoundError(f"No such file or directory while {action} {where}", path=path)
    if exc.errno in _NO_SPACE:
        return CheckpointError(
            f"No space left on device while {action} {where} ({detail}); free space or "
            "write the checkpoint elsewhere",
            path=path,
        )
    if isinstance(exc, PermissionError) or exc.errno in _DENIED:
        return CheckpointError(
            f"Permission denied while {action} {where} ({detail}); check the permissions of "
            "the file and its directory",
            path=path,
        )
    return CheckpointError(f"{type(exc).__name__} while {action} {where}: {detail}", path=path)
