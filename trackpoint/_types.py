"""Input forms accepted at the API edge, named once and normalised there."""

from __future__ import annotations

import os
from typing import Union

__all__ = ["PathLike", "fspath"]

PathLike = Union[str, "os.PathLike[str]"]


def fspath(path: PathLike) -> str:
    """Return ``path`` as a ``str``; URLs (``s3://…``, ``memory://…``) pass through unchanged."""
    result = os.fspath(path)
    if not isinstance(result, str):
        raise TypeError(f"expected a str or os.PathLike[str] path, got {type(path).__name__}")
    return result
