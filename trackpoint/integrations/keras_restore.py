"""``tp.keras.restore``: a keras model's variables, optimizer state and random generators.

Keras numbers the layers of a process (``dense``, ``dense_1``, …), so a model rebuilt in the
same process has other paths than the one saved; :func:`restore` pairs them up to those
numbers, in order, and refuses (naming the variables) when the architectures differ.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import keras
import numpy as np

from trackpoint._types import PathLike
from trackpoint.checkpoint import Checkpoint
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.graph.keys import split_checkpoint_key, variable_key
from trackpoint.integrations.keras_rng import RNG_NAME, GlobalRandomState
from trackpoint.integrations.keras_variables import (
    EPOCH_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    VariableTree,
    variables_by_path,
)
from trackpoint.management import load_checkpoint
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.variable import Variable

__all__ = ["restore"]

_SEPARATOR = re.compile(r"[_/]")


def _name_key(name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(words, numbers)``: ``sequential_1/dense_2/kernel`` → ``((sequential, dense, kernel),
    (1, 2, 0))``; keras's per-process numbering is in the numbers (0 where there is none)."""
    words: list[str] = []
    numbers: list[int] = []
    for token in _SEPARATOR.split(name):
        if token.isdigit() and words:
            numbers[-1] = int(token)
        else:
            words.append(token)
            numbers.append(0)
    return tuple(words), tuple(numbers)


def _pair(saved: Iterable[str], live: Mapping[str, keras.Variable], what: str
          ) -> dict[str, keras.Variable]:
    """Each saved path's live variable: paths equal up to keras's numbering, paired in order.

    Raises:
        InvalidArgumentError: some saved or live variables have no partner (names them).
    """
    groups: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
    for index, names in enumerate((saved, live)):
        for name in names:
            groups.setdefault(_name_key(name)[0], ([], []))[index].append(name)
    pairs: dict[str, keras.Variable] = {}
    only_saved: list[str] = []
    only_live: list[str] = []
    for saved_names, live_names in groups.values():
        if len(saved_names) != len(live_names):
            only_saved += saved_names
            only_live += live_names
            continue
        order = sorted(saved_names, key=lambda n: _name_key(n)[1])
        partners = sorted(live_names, key=lambda n: _name_key(n)[1])
        pairs.update({s: live[p] for s, p in zip(order, partners)})
    if only_saved or only_live:
        raise InvalidArgumentError(
            f"the checkpoint's {what} variables do not match the {what}'s: only in the "
            f"checkpoint {sorted(only_saved)}, only in the {what} {sorted(only_live)}; build "
            "the same architecture as the run that saved it"
        )
    return pairs


def _saved_paths(keys: Iterable[str]) -> dict[str, list[str]]:
    """Variable paths under each top-level name of a checkpoint's keys."""
    found: dict[str, list[str]] = {}
    for key in keys:
        split = split_checkpoint_key(key)
        if split is None or split[1] != VARIABLE_VALUE_KEY or len(split[0]) < 2:
            continue
        parts = split[0]
        found.setdefault(parts[0], []).append("/".join(parts[1:]))
    return found


def restore(model: keras.Model, path_or_directory: PathLike, *, weights_only: bool = False
            ) -> int:
    """Restore ``model``'s weights (and its optimizer's state) in place from a checkpoint.

    Unless ``weights_only``, the process's random generators saved by
    :class:`TrackpointCheckpoint` (python's, numpy's, torch's on the torch backend) are
    restored too, so unseeded dropout and shuffling continue as in the uninterrupted run.

    Reads checkpoints written by :class:`TrackpointCheckpoint` or by
    ``tp.Checkpoint(model=model, optimizer=model.optimizer)``. The optimizer is built first
    (``optimizer.build(model.trainable_variables)``) so its slots exist to receive values.
    All or nothing: every value is read and checked before any variable is assigned.

    Example:
        >>> epoch = tp.keras.restore(model, "/ckpts")          # doctest: +SKIP
        >>> model.fit(x, y, epochs=10, initial_epoch=epoch)   # doctest: +SKIP

    Args:
        model: a built keras model (compiled, to restore the optimizer too).
        path_or_directory: a checkpoint prefix, or a directory (its latest checkpoint).
        weights_only: restore the model's variables only (not the optimizer, not the random
            generators).

    Returns:
        The number of epochs the saving run had completed (0 if the checkpoint does not say):
        pass it to ``fit(initial_epoch=...)``.

    Raises:
        NotFoundError: no checkpoint at ``path_or_directory``.
        FailedPreconditionError: the model is not built, or the checkpoint holds optimizer
            state but the model has no optimizer (compile it, or pass ``weights_only=True``).
        InvalidArgumentError: the variables do not match (names the ones without a partner,
            or the shape/dtype that differs); nothing was assigned.
    """
    if not model.built or not model.variables:
        raise FailedPreconditionError(
            f"model {model.name!r} has no variables yet; build it (call it on a batch or "
            "model.build(input_shape)) before restoring"
        )
    with load_checkpoint(path_or_directory) as reader:
        prefix = reader.prefix
        saved = _saved_paths(reader.keys())
        has_epoch = reader.has_tensor(variable_key(EPOCH_NAME))
        has_rng = any(key.startswith(f"{RNG_NAME}/") for key in reader.keys())
    if MODEL_NAME not in saved:
        raise InvalidArgumentError(
            f"{prefix} holds no model variables (no keys under '{MODEL_NAME}/'); it was not "
            "written by tp.keras.TrackpointCheckpoint or tp.Checkpoint(model=model)",
            path=prefix,
        )
    live = variables_by_path(model.variables, model.name, what=f"model {model.name!r}")
    pairs = _pair(saved[MODEL_NAME], live, "model")
    children: dict[str, Trackable] = {MODEL_NAME: VariableTree(lambda: pairs, "model")}
    optimizer = getattr(model, "optimizer", None)
    if not weights_only and OPTIMIZER_NAME in saved:
        if optimizer is None:
            raise FailedPreconditionError(
                f"{prefix} holds optimizer state but model {model.name!r} has no optimizer; "
                "compile the model first, or pass weights_only=True",
                path=prefix,
            )
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        what = f"optimizer {optimizer.name!r}"
        optimizer_live = variables_by_path(optimizer.variables, optimizer.name, what=what)
        optimizer_pairs = _pair(saved[OPTIMIZER_NAME], optimizer_live, "optimizer")
        children[OPTIMIZER_NAME] = VariableTree(lambda: optimizer_pairs, what)
    if not weights_only and has_rng:
        children[RNG_NAME] = GlobalRandomState()
    epoch = Variable(np.zeros((), dtype=np.int64), name=EPOCH_NAME)
    if has_epoch:
        children[EPOCH_NAME] = epoch
    Checkpoint(**children).read(prefix).expect_partial()
    return int(epoch.numpy())
