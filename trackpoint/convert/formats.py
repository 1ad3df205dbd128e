"""Which format a path names for ``convert``, from its extension, and refusing the unknown ones.

A checkpoint is a prefix, usually without an extension (``run/ckpt-3``); TensorFlow's classic
``model.ckpt`` and a checkpoint's own files (``ckpt-3.index``) count too. Any other extension
(``model.onnx``, ``weights.h5``) is refused rather than taken for a checkpoint prefix: writing
``x.onnx.index`` silently is worse than an error that lists what trackpoint converts. An explicit
format (``--to checkpoint``) allows a prefix with any name.
"""

from __future__ import annotations

import re

from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.management.paths import resolve_prefix
from trackpoint.storage import locate

__all__ = ["EXTENSIONS", "FORMATS", "check_format", "detect_format"]

FORMATS = ("checkpoint", "torch", "safetensors")

EXTENSIONS: dict[str, str] = {
    ".safetensors": "safetensors",
    ".pt": "torch",
    ".pth": "torch",
    ".bin": "torch",
    ".ckpt": "checkpoint",  # TensorFlow's classic prefix name, model.ckpt
    ".index": "checkpoint",  # a checkpoint's index file stands for its prefix
}
"""Extension → format; a name without an extension is a checkpoint prefix."""

# What counts as an extension: letters first, then letters, digits or "_" (so ``ckpt-3``,
# ``.data-00000-of-00001`` and ``v1.2`` are not extensions).
_EXTENSION = re.compile(r"\.([A-Za-z][A-Za-z0-9_]{0,15})$")


def _extension(path: str) -> str | None:
    base = path.rstrip("/").rsplit("/", 1)[-1]
    match = _EXTENSION.search(base)
    return match.group(0).lower() if match and match.start() > 0 else None


def detect_format(path: PathLike) -> str:
    """``"safetensors"``, ``"torch"`` or ``"checkpoint"`` from the file name (unknown
    extensions are checkpoints here; :func:`check_format` refuses them)."""
    extension = _extension(fspath(path))
    return EXTENSIONS.get(extension, "checkpoint") if extension else "checkpoint"


def _known() -> str:
    by_format: dict[str, list[str]] = {}
    for extension, fmt in EXTENSIONS.items():
        by_format.setdefault(fmt, []).append(extension)
    listed = "; ".join(f"{fmt}: {', '.join(exts)}" for fmt, exts in by_format.items())
    return f"{listed} (or a checkpoint prefix without an extension)"


def check_format(fmt: str | None, path: str, *, source: bool) -> str:
    """The format of ``path``: ``fmt`` if given (checked), else from its extension.

    Raises:
        InvalidArgumentError: ``fmt`` is not one of :data:`FORMATS`, or ``path`` has an
            extension trackpoint does not convert (the message lists the known ones); a source
            with such a name is accepted when it is an existing checkpoint or directory.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise InvalidArgumentError(
                f"unknown format {fmt!r} for {path}; use one of {', '.join(FORMATS)}", path=path
            )
        return fmt
    extension = _extension(path)
    if extension is None or extension in EXTENSIONS:
        return detect_format(path)
    if source:
        try:
            resolve_prefix(path)
            return "checkpoint"  # an existing checkpoint with a dot in its name
        except (NotFoundError, InvalidArgumentError):
            pass
        if not locate(path).storage.exists(path):
            raise NotFoundError(
                f"{path} does not exist (and {extension} is no format trackpoint converts: "
                f"{_known()})",
                path=path,
            )
    side = "--from" if source else "--to"
    raise InvalidArgumentError(
        f"cannot tell the format of {path}: trackpoint does not convert {extension} files. "
        f"Known: {_known()}. To use this name for a checkpoint prefix anyway, say so with "
        f"{side} checkpoint (format='checkpoint')",
        path=path,
    )
