"""The ``checkpoint`` state file: which checkpoint in a directory is the latest.

A text-format ``CheckpointState`` proto (tf-checkpoint-format.md §10), written atomically
(temporary name + rename) so readers see the old or the new file, never a torn one. Paths are
stored relative to the directory, and returned joined to it.

A state file names only checkpoints in its own directory: an entry that leaves it
(``../other/ckpt``, an absolute path or URL elsewhere) is refused with a ``DataLossError``, so
neither a reader nor a manager's pruning is ever led outside by the file. TensorFlow follows such
paths; what it writes itself (relative names, or TF1's absolute paths into the directory) reads
the same here, and so does a directory moved with TF1's absolute paths in it (see
:func:`get_checkpoint_state`).
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Sequence

from google.protobuf import text_format

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.protos.checkpoint_state_pb2 import CheckpointState
from trackpoint.errors import (
    CheckpointError,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
)
from trackpoint.storage import Storage, is_url, locate

__all__ = [
    "STATE_FILENAME",
    "CheckpointState",
    "checkpoint_directory",
    "checkpoint_exists",
    "get_checkpoint_mtimes",
    "get_checkpoint_state",
    "inside",
    "latest_checkpoint",
    "remove_checkpoint",
    "write_checkpoint_state",
]

logger = logging.getLogger(__name__)

STATE_FILENAME = "checkpoint"


def checkpoint_directory(prefix: str) -> str:
    """The directory of checkpoint ``prefix``: where its state file lives (``.`` if none)."""
    if is_url(prefix):
        return posixpath.dirname(prefix)
    return os.path.dirname(prefix) or "."


def _join(directory: str, path: str) -> str:
    if is_url(path) or posixpath.isabs(path) or os.path.isabs(path):
        return path
    if is_url(directory):
        return posixpath.join(directory, path)
    return os.path.join(directory, path)


def _is_absolute(path: str) -> bool:
    return is_url(path) or posixpath.isabs(path) or os.path.isabs(path)


def _escapes(relative: str, *, url: bool) -> bool:
    """True if the normalized relative path ``relative`` names nothing inside its directory."""
    norm = posixpath.normpath(relative) if url else os.path.normpath(relative)
    sep = "/" if url else os.sep
    return norm in (".", "..") or norm.startswith(".." + sep) or _is_absolute(norm)


def inside(directory: str, path: str) -> str | None:
    """``path`` relative to ``directory`` if it names something inside it, else None.

    A relative ``path`` is taken as it is given (relative to the working directory, like every
    path a caller passes); the comparison is lexical, on absolute paths or URLs.
    """
    url = is_url(directory)
    if url != is_url(path):
        return None
    if url:
        base = directory.rstrip("/") + "/"
        if not path.startswith(base):
            return None
        rest = posixpath.normpath(path[len(base):])
    else:
        rest = os.path.relpath(os.path.abspath(path), os.path.abspath(directory or "."))
    return None if _escapes(rest, url=url) else rest


def _stored_name(directory: str, path: str, state_path: str) -> str:
    """How the state file records checkpoint ``path``: relative to ``directory`` (TF2 writers
    do this). A bare name is taken as relative to ``directory`` already.

    Raises:
        InvalidArgumentError: ``path`` lies outside ``directory``.
    """
    url = is_url(directory)
    parent = posixpath.dirname(path) if url else os.path.dirname(path)
    bare = not _is_absolute(path) and not parent
    rest = (None if _escapes(path, url=url) else path) if bare else inside(directory, path)
    if rest is None:
        raise InvalidArgumentError(
            f"cannot record the checkpoint {path!r} in {state_path}: it is not inside "
            f"{directory}, and a state file names only checkpoints in its own directory; save "
            "the checkpoint into that directory, or record it in its own directory's state file",
            path=state_path,
        )
    return rest


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
    does. Paths are stored relative to ``directory`` (a bare name is one already).

    Raises:
        InvalidArgumentError: a checkpoint prefix collides with the state file's own path, or
            lies outside ``directory``.
    """
    directory = fspath(directory, argument="directory")
    storage = locate(directory, storage=storage).storage
    state_path = _join(directory, STATE_FILENAME)
    paths = list(all_model_checkpoint_paths or [])
    if not paths or paths[-1] != model_checkpoint_path:
        paths = [p for p in paths if p != model_checkpoint_path] + [model_checkpoint_path]
    names = [_stored_name(directory, p, state_path) for p in paths]
    for p, name in zip(paths, names):
        if name == STATE_FILENAME:
            raise InvalidArgumentError(
                f"checkpoint prefix {p!r} collides with the state file {state_path!r}; "
                "choose another checkpoint name",
                path=state_path,
            )
    state = CheckpointState(model_checkpoint_path=names[-1], all_model_checkpoint_paths=names)
    if all_model_checkpoint_timestamps is not None:
        state.all_model_checkpoint_timestamps.extend(all_model_checkpoint_timestamps)
    if last_preserved_timestamp is not None:
        state.last_preserved_timestamp = last_preserved_timestamp
    storage.makedirs(directory)
    storage.write_atomic(state_path, text_format.MessageToString(state).encode("utf-8"))


def get_checkpoint_state(
    directory: PathLike, *, storage: Storage | None = None
) -> CheckpointState | None:
    """Parse ``directory/checkpoint``; paths in the result are joined to ``directory``.

    Every entry must lie inside ``directory``. An absolute entry outside it is accepted in one
    case: the directory was moved with TF1 ``Saver``'s absolute paths in it. That is, the
    latest entry's name is a committed checkpoint here and no longer at its old path (see
    ``_moved_from``); then every entry under the latest's old directory is mapped into this one
    (TensorFlow would follow the old paths).

    Returns None when the file does not exist or cannot be parsed (logged as a warning, as TF
    does).

    Raises:
        InvalidArgumentError: the file parses but names no checkpoint (e.g. it is empty).
        DataLossError: an entry (latest or any of ``all_model_checkpoint_paths``) leaves
            ``directory``; the message names the file and the entry.
    """
    directory = fspath(directory, argument="directory")
    storage = locate(directory, storage=storage).storage
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
    moved_from = _moved_from(directory, state.model_checkpoint_path, storage)
    state.model_checkpoint_path = _confined(
        directory, state.model_checkpoint_path, moved_from, state_path
    )
    joined = [_confined(directory, p, moved_from, state_path)
              for p in state.all_model_checkpoint_paths]
    del state.all_model_checkpoint_paths[:]
    state.all_model_checkpoint_paths.extend(joined)
    return state


def _moved_from(directory: str, latest: str, storage: Storage) -> str | None:
    """The directory the state file was written in, if it was moved here with its checkpoints.

    TF1's ``Saver`` records absolute paths. The state file's latest checkpoint, named by an
    absolute path outside ``directory``, is taken as moved here when ``directory`` holds a
    checkpoint of that name and the old path no longer does (or is ``directory`` under another
    name, a symbolic link). A checkpoint still at the old path makes the entry a pointer out of
    the directory, which is refused. The old path is probed only on the directory's own store
    (local disk, or the same bucket): a directory downloaded from another store is taken as a
    copy of it, without asking that store anything.
    """
    if not _is_absolute(latest) or inside(directory, latest) is not None:
        return None
    url = is_url(latest)
    old = posixpath.dirname(latest) if url else os.path.dirname(latest)
    name = posixpath.basename(latest) if url else os.path.basename(latest)
    if not name or not checkpoint_exists(_join(directory, name), storage=storage):
        return None
    if _same_store(directory, latest):
        if not url and _same_directory(old, directory):
            return old
        if checkpoint_exists(latest, storage=storage):
            return None
    return old


def _same_store(directory: str, path: str) -> bool:
    """Both on local disk, or both URLs of one scheme and bucket (host)."""
    if is_url(directory) != is_url(path):
        return False
    if not is_url(path):
        return True
    return directory.split("/", 3)[:3] == path.split("/", 3)[:3]


def _same_directory(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _confined(directory: str, entry: str, moved_from: str | None, state_path: str) -> str:
    """``entry`` of the state file as a path inside ``directory``.

    Relative entries are joined to ``directory`` (``./ckpt-2`` too); absolute ones (and URLs)
    are kept if they lie inside it, else mapped from the directory it was moved from.

    Raises:
        DataLossError: ``entry`` leaves ``directory`` (``../other/ckpt``, an absolute path or
            URL elsewhere): a state file is never followed out of its directory, so neither a
            reader nor a manager's pruning touches anything outside it.
    """
    if not _is_absolute(entry):
        if not _escapes(entry, url=is_url(directory)):
            return _join(directory, entry)
    elif inside(directory, entry) is not None:
        return entry
    elif moved_from is not None:
        rest = inside(moved_from, entry)
        if rest is not None:
            return _join(directory, rest)
    raise DataLossError(
        f"the checkpoint state file {state_path} names {entry!r}, which is outside "
        f"{directory}: a state file may name only checkpoints in its own directory (relative "
        "names such as 'ckpt-3', or absolute paths inside the directory), and trackpoint "
        "neither reads nor deletes anything elsewhere on its word (a directory moved with "
        "absolute paths in its state file is recognized only if its latest checkpoint is here "
        "and no longer at the old path). Rewrite the file with the names of the checkpoints "
        f"in {directory} (model_checkpoint_path: \"ckpt-3\"), or delete it and pass a "
        "checkpoint prefix explicitly.",
        path=state_path,
    )


def checkpoint_exists(prefix: PathLike, *, storage: Storage | None = None) -> bool:
    """True iff ``prefix.index`` exists: the index is the commit point of a checkpoint."""
    prefix = fspath(prefix)
    storage = locate(prefix, storage=storage).storage
    return storage.exists(prefix + ".index")


def latest_checkpoint(directory: PathLike, *, storage: Storage | None = None) -> str | None:
    """The prefix of the newest committed checkpoint in ``directory``, or None.

    Never names an incomplete checkpoint: the state file is written only after the commit, and
    a prefix whose ``.index`` is missing is reported (logged) and ignored.

    Raises:
        DataLossError: the state file names a path outside ``directory``.
    """
    directory = fspath(directory, argument="directory")
    # One backend for the state file and the prefix it names: the file names only checkpoints
    # in its own directory.
    storage = locate(directory, storage=storage).storage
    try:
        state = get_checkpoint_state(directory, storage=storage)
    except DataLossError:
        raise  # a hostile state file (it points outside the directory): say so
    except CheckpointError:
        return None  # an empty state file names no checkpoint
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
    storage = locate(prefix, storage=storage).storage
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
