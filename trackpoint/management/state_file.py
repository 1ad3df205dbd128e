"""The ``checkpoint`` state file: which checkpoint in a directory is the latest.

A text-format ``CheckpointState`` proto (tf-checkpoint-format.md §10), written atomically
(temporary name + rename) so readers see the old or the new file, never a torn one. Paths are
stored relative to the directory when they lie inside it, and returned absolute.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Sequence

from google.protobuf import text_format

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.protos.checkpoint_state_pb2 import CheckpointState
from trackpoint.errors import CheckpointError, InvalidArgumentError, NotFoundError
from trackpoint.storage import Storage, storage_for

__all__ = [
    "STATE_FILENAME",
    "CheckpointState",
    "checkpoint_directory",
    "checkpoint_exists",
    "get_checkpoint_mtimes",
    "get_checkpoint_state",
    "latest_checkpoint",
    "remove_checkpoint",
    "write_checkpoint_state",
]

logger = logging.getLogger(__name__)

STATE_FILENAME = "checkpoint"


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def checkpoint_directory(prefix: str) -> str:
    """The directory of checkpoint ``prefix``: where its state file lives (``.`` if none)."""
    if _is_url(prefix):
        return posixpath.dirname(prefix)
    return os.path.dirname(prefix) or "."


def _join(directory: str, path: str) -> str:
    if _is_url(path) or posixpath.isabs(path) or os.path.isabs(path):
        return path
    if _is_url(directory):
        return posixpath.join(directory, path)
    return os.path.join(directory, path)


def _relative(directory: str, path: str) -> str:
    """``path`` relative to ``directory`` when it lies directly inside it (TF2 writers do this)."""
    if _is_url(path) != _is_url(directory):
        return path
    parent = posixpath.dirname(path) if _is_url(path) else os.path.dirname(path)
    if _is_url(path):
        same = parent.rstrip("/") == directory.rstrip("/")
    else:
        same = os.path.abspath(parent or ".") == os.path.abspath(directory or ".")
    return posixpath.basename(path) if same else path


def write_checkpoint_state(
    directory: PathLike,
    model_checkpoint_path: str,
    all_model_checkpoint_paths: Sequence[str] | None = None,
    all_model_checkpoint_timestamps: Sequence[float] | None = None,
    last_preserved_timestamp: float | None = None,
    *,
    storage: Storage | None = None,
) -> None:
    """Atomically (re)write ``directory/checkpoint``.

    ``model_checkpoint_path`` is appended to ``all_model_checkpoint_paths`` if missing, as TF
    does. Paths inside ``directory`` are stored relative to it.

    Raises:
        InvalidArgumentError: a checkpoint prefix collides with the state file's own path.
    """
    directory = fspath(directory, argument="directory")
    storage = storage or storage_for(directory)
    state_path = _join(directory, STATE_FILENAME)
    paths = list(all_model_checkpoint_paths or [])
    if not paths or paths[-1] != model_checkpoint_path:
        paths = [p for p in paths if p != model_checkpoint_path] + [model_checkpoint_path]
    for p in paths:
        if os.path.normpath(_join(directory, p)) == os.path.normpath(state_path):
            raise InvalidArgumentError(
                f"checkpoint prefix {p!r} collides with the state file {state_path!r}; "
                "choose another checkpoint name",
                path=state_path,
            )
    state = CheckpointState(
        model_checkpoint_path=_relative(directory, model_checkpoint_path),
        all_model_checkpoint_paths=[_relative(directory, p) for p in paths],
    )
    if all_model_checkpoint_timestamps is not None:
        state.all_model_checkpoint_timestamps.extend(all_model_checkpoint_timestamps)
    if last_preserved_timestamp is not None:
        state.last_preserved_timestamp = last_preserved_timestamp
    storage.makedirs(directory)
    storage.write_atomic(state_path, text_format.MessageToString(state).encode("utf-8"))


def get_checkpoint_state(
    directory: PathLike, *, storage: Storage | None = None
) -> CheckpointState | None:
    """Parse ``directory/checkpoint``; paths in the result are absolute (joined to ``directory``).

    Returns None when the file does not exist or cannot be parsed (logged as a warning, as TF
    does).

    Raises:
        InvalidArgumentError: the file parses but names no checkpoint (e.g. it is empty).
    """
    directory = fspath(directory, argument="directory")
    storage = storage or storage_for(directory)
    state_path = _join(directory, STATE_FILENAME)
    try:
        raw = storage.read_bytes(state_path)
    except NotFoundError:
        return None
    state = CheckpointState()
    try:
        text_format.Parse(raw.decode("utf-8"), state)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        logger.warning("ignoring unreadable checkpoint state file %s: %s", state_path, exc)
        return None
    if not state.model_checkpoint_path:
        raise InvalidArgumentError(
            f"Invalid checkpoint state loaded from {state_path}: it names no checkpoint "
            "(model_checkpoint_path is empty); delete or rewrite the file",
            path=state_path,
        )
    state.model_checkpoint_path = _join(directory, state.model_checkpoint_path)
    joined = [_join(directory, p) for p in state.all_model_checkpoint_paths]
    del state.all_model_checkpoint_paths[:]
    state.all_model_checkpoint_paths.extend(joined)
    return state


def checkpoint_exists(prefix: PathLike, *, storage: Storage | None = None) -> bool:
    """True iff ``prefix.index`` exists: the index is the commit point of a checkpoint."""
    prefix = fspath(prefix)
    storage = storage or storage_for(prefix)
    return storage.exists(prefix + ".index")


def latest_checkpoint(directory: PathLike, *, storage: Storage | None = None) -> str | None:
    """The prefix of the newest committed checkpoint in ``directory``, or None.

    Never names an incomplete checkpoint: the state file is written only after the commit, and
    a prefix whose ``.index`` is missing is reported (logged) and ignored.
    """
    directory = fspath(directory, argument="directory")
    try:
        state = get_checkpoint_state(directory, storage=storage)
    except CheckpointError:
        return None
    if state is None:
        return None
    prefix = state.model_checkpoint_path
    if checkpoint_exists(prefix, storage=storage):
        return prefix
    logger.error("the state file in %s names %s, but %s.index does not exist", directory,
                 prefix, prefix)
    return None


def get_checkpoint_mtimes(prefixes: Sequence[PathLike]) -> list[float]:
    """Modification times (seconds since the epoch) of the checkpoints' ``.index`` files."""
    times = []
    for prefix in prefixes:
        path = fspath(prefix) + ".index"
        try:
            times.append(os.stat(path).st_mtime)
        except FileNotFoundError:
            continue
    return times


def remove_checkpoint(prefix: PathLike, *, storage: Storage | None = None) -> None:
    """Delete a checkpoint's index first (so it stops existing at once), then its data files."""
    prefix = fspath(prefix)
    storage = storage or storage_for(prefix)
    directory = storage.dirname(prefix) or "."
    base = storage.basename(prefix)
    storage.remove(prefix + ".index", missing_ok=True)
    for name in storage.list(directory):
        rest = name[len(base):]
        if name.startswith(base) and _is_data_suffix(rest):
            storage.remove(storage.join(directory, name), missing_ok=True)


def _is_data_suffix(rest: str) -> bool:
    """True for ``.data-SSSSS-of-NNNNN`` (exactly five digits each, as TF's glob)."""
    if len(rest) != len(".data-00000-of-00000") or not rest.startswith(".data-"):
        return False
    return rest[6:11].isdigit() and rest[11:15] == "-of-" and rest[15:].isdigit()
