"""What Hugging Face Accelerate and Trainer checkpoint besides modules and optimizers.

Both save "every RNG of the process" and commit a whole *directory* per checkpoint
(``checkpoint-500/``, ``checkpoints/checkpoint_3/``), where trackpoint commits one prefix
inside a directory. This module holds the pieces both integrations share:

* :class:`ProcessRNG`: Python's ``random``, numpy's global ``RandomState`` and torch's default
  generators (CPU and every CUDA device, :class:`~trackpoint.integrations.torch.TorchRNG`),
  saved as ``rng/python``, ``rng/numpy`` and ``rng/torch/cpu`` — what Trainer's
  ``rng_state.pth`` and Accelerate's ``random_states_0.pkl`` hold, without pickle;
* :class:`StagedDirectory`: writes a checkpoint directory under a hidden sibling name
  (``.checkpoint-500.trackpoint-partial``) and renames it into place once everything in it is
  committed and synced, so a SIGKILL at any instant leaves either the whole directory or none
  of it under the name that ``get_last_checkpoint`` (and :func:`latest_directory`) looks for;
* :func:`json_state`: a JSON value (Trainer's state, Accelerate's counters) as checkpoint state.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.torch_state import TorchRNG
from trackpoint.management import latest_checkpoint
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.python_random import PythonRandomState
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = [
    "PARTIAL_SUFFIX",
    "JsonValue",
    "ProcessRNG",
    "PythonRandomState",
    "StagedDirectory",
    "committed_prefix",
    "fsync_tree",
    "remove_stale_staging",
]

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".trackpoint-partial"
"""Suffix of a checkpoint directory being written: ``.<name>.trackpoint-partial``."""
_REPLACED_SUFFIX = ".trackpoint-replaced"


class ProcessRNG(Trackable):
    """Every random generator a training step may draw from: python, numpy, torch.

    Children ``python`` (:class:`PythonRandomState`), ``numpy`` (the global ``RandomState``
    behind ``np.random.*``) and ``torch`` (``cpu`` and ``cuda:<i>``). Restoring needs the same
    devices as saving: a checkpoint written with CUDA restored without it leaves
    ``rng/torch/cuda:0`` unmatched, which ``assert_consumed`` reports.
    """

    def __init__(self) -> None:
        numpy_state = to_trackable(np.random.mtrand._rand)
        assert numpy_state is not None  # numpy_random's adapter, registered lazily
        self._children: dict[str, Trackable] = {
            "python": PythonRandomState(),
            "numpy": numpy_state,
            "torch": TorchRNG(),
        }

    def __repr__(self) -> str:
        return "<process RNG: python, numpy, torch>"

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        return dict(self._children)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        return (cached_dependencies or self._children).get(name)


class JsonValue(PythonState):
    """A value saved as JSON; a restore calls ``on_restore`` with the value read.

    Args:
        value: what to save (plain Python values, numpy arrays).
        what: how error messages name it.
        on_restore: receives the restored value; None ignores it (a value saved for readers
            only, such as Trainer's state, which Trainer reads from ``trainer_state.json``).
    """

    def __init__(
        self, value: Any, what: str, on_restore: Callable[[Any], None] | None = None
    ) -> None:
        self._value = value
        self._what = what
        self._on_restore = on_restore

    def __repr__(self) -> str:
        return f"<{self._what}>"

    def serialize(self) -> bytes:
        # docstring inherited
        value = self._value() if callable(self._value) else self._value
        return dumps(value, what=self._what)

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        value = loads(data, what=self._what)
        on_restore = self._on_restore
        return (lambda: None) if on_restore is None else functools.partial(on_restore, value)


def fsync_tree(directory: str) -> None:
    """fsync every file directly in ``directory`` and the directory itself (before a rename)."""
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def committed_prefix(directory: str) -> str | None:
    """The checkpoint prefix a trackpoint checkpoint directory commits, or None.

    None for a directory without a ``checkpoint`` state file naming a committed checkpoint
    (a Trainer or Accelerate directory of ``torch.save`` files, a staging directory).
    """
    if not os.path.isdir(directory):
        return None
    return latest_checkpoint(directory)


class StagedDirectory:
    """A checkpoint directory written under a hidden name and renamed into place at the end.

    Example:
        >>> staged = StagedDirectory("out/checkpoint-500")
        >>> write_everything_into(staged.path)      # out/.checkpoint-500.trackpoint-partial
        >>> staged.commit()                         # out/checkpoint-500, complete

    A staging directory left by a killed process is deleted when the same name is staged
    again. Committing over an existing directory (a save at the same step again) moves the
    old one aside, renames the new one in and only then deletes the old one; a kill between
    those two renames leaves the old one under ``.<name>.trackpoint-replaced``.
    """

    def __init__(self, final: str) -> None:
        final = os.path.abspath(final)
        parent, name = os.path.split(final)
        if not name or name.startswith("."):
            raise InvalidArgumentError(
                f"cannot stage a checkpoint directory named {final!r}: the name must not be "
                "empty or start with '.' (hidden names are used for directories being written)"
            )
        self.final = final
        self.path = os.path.join(parent, f".{name}{PARTIAL_SUFFIX}")
        os.makedirs(parent, exist_ok=True)
        if os.path.lexists(self.path):
            logger.info("removing %s, left by a save that did not finish", self.path)
            shutil.rmtree(self.path)
        os.makedirs(self.path)

    def commit(self) -> str:
        """Rename the staged directory to its final name; returns the final path."""
        fsync_tree(self.path)
        parent, name = os.path.split(self.final)
        replaced = None
        if os.path.lexists(self.final):
            replaced = os.path.join(parent, f".{name}{_REPLACED_SUFFIX}")
            if os.path.lexists(replaced):
                shutil.rmtree(replaced)
            os.rename(self.final, replaced)
        os.rename(self.path, self.final)
        _fsync_directory(parent)
        if replaced is not None:
            shutil.rmtree(replaced)
        logger.debug("committed checkpoint directory %s", self.final)
        return self.final

    def abandon(self) -> None:
        """Delete the staged directory (a save that failed)."""
        shutil.rmtree(self.path, ignore_errors=True)


def remove_stale_staging(parent: str) -> list[str]:
    """Delete staging directories a killed save left in ``parent``; returns what was removed.

    Only for the one writer of ``parent`` (a Trainer's ``output_dir`` at the start of
    ``train``): another process's save in progress would be deleted too.
    """
    removed: list[str] = []
    if not os.path.isdir(parent):
        return removed
    for entry in os.scandir(parent):
        if entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
