"""Input forms accepted at the API edge, named once and normalised there.

Sits under every layer; the only module of ours it imports is :mod:`trackpoint.errors` (which
imports none), so a wrong input type is an :class:`~trackpoint.errors.InvalidArgumentError`
wherever it is normalised.
"""

from __future__ import annotations

import os
from typing import Union

from trackpoint.errors import InvalidArgumentError

__all__ = ["PathLike", "fspath"]

PathLike = Union[str, "os.PathLike[str]"]


def fspath(path: PathLike, *, argument: str = "path") -> str:
    """Return ``path`` as a ``str``; URLs (``s3://…``, ``memory://…``) pass through unchanged.

    Args:
        path: what the caller passed.
        argument: the caller's parameter name, quoted in the error.

    Raises:
        InvalidArgumentError: ``path`` is not a ``str`` or ``os.PathLike[str]`` (bytes paths
            included: checkpoint keys and prefixes are text).
    """
    # os.fspath raises TypeError for anything else; check first so the message names the
    # argument and what it accepts.
    result = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(result, str):
        raise InvalidArgumentError(
            f"{argument} must be a str or os.PathLike[str] (a directory, checkpoint prefix or "
            f"URL), got {type(path).__name__}: {path!r:.80}"
        )
    return result
