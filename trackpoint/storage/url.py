"""The one URL rule: which paths name a non-local location, and how a URL splits.

Every layer asks :func:`is_url` (re-exported as ``trackpoint.storage.is_url``) instead of
testing ``"://" in path`` itself, so a path is local or remote the same way everywhere: to the
backend picker, to the state file's path arithmetic, to the converters.
"""

from __future__ import annotations

import re

__all__ = ["FILE_SCHEME", "is_url", "local_path", "split_scheme"]

FILE_SCHEME = "file://"

# A protocol name (RFC 3986 scheme letters) then "://" or fsspec's chain separator "::".
# Two letters at least: fsspec, like Windows, reads "C://x" as drive C, not a protocol.
_PROTOCOL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+(?:://|::)")


def is_url(path: str) -> bool:
    """True if ``path`` names a non-local location, served by fsspec.

    ``s3://b/k``, ``memory://x`` and chained ``simplecache::s3://b/k`` are URLs. ``file://``
    URLs are local (the local backend strips the scheme), and so is anything that does not
    start with a protocol name: ``C:\\ckpt``, ``C://ckpt``, ``dir/a::b``, ``/tmp/x://y``.
    """
    return _PROTOCOL.match(path) is not None and not path.startswith(FILE_SCHEME)


def local_path(path: str) -> str:
    """``path`` as the operating system names it: a ``file://`` scheme stripped."""
    return path[len(FILE_SCHEME) :] if path.startswith(FILE_SCHEME) else path


def split_scheme(path: str) -> tuple[str, str]:
    """``"s3://b/k"`` -> ``("s3://", "b/k")``; ``"simplecache::s3://b/k"`` ->
    ``("simplecache::s3://", "b/k")``; a path without a scheme -> ``("", path)``."""
    scheme, sep, rest = path.partition("://")
    return (scheme + sep, rest) if sep else ("", path)
