"""Restoring name-based (TF1 ``Saver``) checkpoints into objects.

A checkpoint written by ``tf.compat.v1.train.Saver`` has no object graph
(``_CHECKPOINTABLE_OBJECT_GRAPH``): its keys are variable names such as ``dense/kernel``.
``Checkpoint.read``/``restore`` of one matches values to objects by name, as TensorFlow's
``NameBasedSaverStatus`` does in eager mode:

* A value's TF1 key is, in this order: what ``CheckpointOptions.name_map`` gives for the value's
  object-based key (``model/w/.ATTRIBUTES/VARIABLE_VALUE``); below a torch module, the value's
  path under the module (its ``state_dict`` key with ``.`` → ``/``); the ``name`` given to a
  ``tp.Variable`` (unnamed variables and tracked arrays have none, so a TF1 default name such
  as ``Variable`` never lands in them by accident). An object none of these name, or whose
  key the checkpoint lacks, finds no value.
* Every reachable object whose values are all in the checkpoint is restored at once through
  the one restore engine (:func:`~trackpoint.checkpoint.restore.restore_items`): nothing
  changes if one value is damaged or does not fit its object.
* The restore then waits on every object it reached (``Trackable._name_based_restorations``,
  TF's ``_name_based_restores``): a child attached later, under any name, is matched and
  restored with its subtree on attach, for as long as those objects live.
* Checkpoint keys no object uses are fine. The status's assertions fail when an object that
  owns values found none; ``save_counter`` is exempt (TF1 checkpoints do not have one).

Optimizer slot variables are not matched (they are not reached by name); torch submodules
registered after the restore are not restored (torch's registration hooks only serve
object-based restores).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trackpoint.bundle.reader import BundleReader
from trackpoint.checkpoint.load_status import NameBasedSaverStatus
from trackpoint.checkpoint.restore import RestoreItem, restore_items
from trackpoint.graph.keys import OBJECT_GRAPH_KEY, SAVE_COUNTER, checkpoint_key, escape_local_name
from trackpoint.graph.walk import ObjectGraphView
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, has_values, next_restore_uid
from trackpoint.tracking.variable import Variable

__all__ = ["NameBasedRestore", "restore_name_based"]

logger = logging.getLogger("trackpoint.checkpoint")

_SHOW_AT_MOST = 10

NameMap = Mapping[str, str] | Callable[[str], "str | None"]


class _Reached(NamedTuple):
    """An object the restore reached, and how it is named."""

    trackable: Trackable
    path: tuple[str, ...]  # local names from the root
    scope: int | None  # path[scope:] is its name below a name scope (torch module), if any


def _is_name_scope(trackable: Trackable) -> bool:
    """True for objects whose descendants are named by their path below them (torch modules).

    A trackable class opts in with ``_name_based_scope = True``.
    """
    return getattr(type(trackable), "_name_based_scope", False) is True


def _readable(path: tuple[str, ...]) -> str:
    return ".".join(["(root)", *path])


def _walk(view: ObjectGraphView, base: tuple[str, ...], scope: int | None) -> list[_Reached]:
    """Every object reachable in ``view`` (first path wins), its path after ``base`` and scope."""
    objects, paths = view.breadth_first_traversal()
    if scope is None and _is_name_scope(view.root):
        scope = len(base)
    reached = []
    for obj in objects:
        refs = paths[id(obj)]
        own_scope = scope
        if own_scope is None:
            for depth, ref in enumerate(refs, start=1):
                if _is_name_scope(ref.ref):
                    own_scope = len(base) + depth
                    break
        reached.append(_Reached(obj, base + tuple(ref.name for ref in refs), own_scope))
    return reached


@dataclass(slots=True)
class _WarningState:
    """What the unrestored-values warning needs, kept apart so the finalizer can hold it."""

    prefix: str
    keys: tuple[str, ...]  # every value key of the checkpoint
    used: set[str] = field(default_factory=set)
    unmatched: dict[int, str] = field(default_factory=dict)  # id(object) -> why, readable
    expect_partial: bool = False


def _warn_unrestored(state: _WarningState) -> None:
    """Log one warning about what a dropped name-based restore left unrestored (C4)."""
    if state.expect_partial:
        return
    unused = [key for key in state.keys if key not in state.used]
    if not unused and not state.unmatched:
        return
    lines = [f"Object found no value: {why}" for why in state.unmatched.values()]
    lines += [f"Value in checkpoint was not used: {key}" for key in unused]
    more = len(lines) - _SHOW_AT_MOST
    shown = lines[:_SHOW_AT_MOST] + ([f"... and {more} more"] if more > 0 else [])
    logger.warning(
        "A name-based (TF1) checkpoint restore from %s is being dropped with unrestored "
        "values. To silence this warning, call `status.expect_partial()` on the status that "
        "`read()`/`restore()` returned.\n  %s",
        state.prefix,
        "\n  ".join(shown),
    )


class NameBasedRestore:
    """The state of one name-based load: how values are named, what was restored, what not.

    Held by its status and by the positions waiting on the objects it reached; holds no
    object strongly. When it is dropped, a warning lists objects that found no value and
    checkpoint values nobody used, unless ``expect_partial()`` was called.

    Args:
        prefix: the checkpoint.
        index: its reader, possibly closed (reopened for every restore: no file stays open).
        name_map: ``CheckpointOptions.name_map``.
    """

    def __init__(self, prefix: str, index: BundleReader, name_map: NameMap | None) -> None:
        self.prefix = prefix
        self.index = index
        self.name_map = name_map
        self.restore_uid = next_restore_uid()
        keys = tuple(key for key in index.keys() if key != OBJECT_GRAPH_KEY)
        self._warning = _WarningState(prefix, keys)
        finalizer = weakref.finalize(self, _warn_unrestored, self._warning)
        finalizer.atexit = False

    @property
    def expect_partial(self) -> bool:
        return self._warning.expect_partial

    @expect_partial.setter
    def expect_partial(self, value: bool) -> None:
        self._warning.expect_partial = value

    def __deepcopy__(self, memo: dict[int, Any]) -> NameBasedRestore:
        return self  # shared by copies of the objects waiting on it

    # -- naming ------------------------------------------------------------------------------

    def _key(self, reached: _Reached, value_name: str, single: bool) -> str | None:
        """The TF1 key of one value of ``reached``, or None if nothing names it."""
        name_map = self.name_map
        if name_map is not None:
            object_key = self._object_key(reached, value_name)
            mapped = (
                name_map.get(object_key) if isinstance(name_map, Mapping) else name_map(object_key)
            )
            if mapped is not None:
                return mapped
        if reached.scope is not None and len(reached.path) > reached.scope:
            relative = "/".join(reached.path[reached.scope :])
            return relative if single else f"{relative}/{value_name}"
        if isinstance(reached.trackable, Variable) and value_name == VARIABLE_VALUE_KEY:
            return reached.trackable.given_name
        return None

    @staticmethod
    def _object_key(reached: _Reached, value_name: str) -> str:
        return checkpoint_key("/".join(escape_local_name(n) for n in reached.path), value_name)

    def _match(self, reached: _Reached) -> tuple[dict[str, str] | None, str]:
        """``({value name: TF1 key}, "")`` if every needed value is in the checkpoint, else
        ``(None, why not)``; ``({}, "")`` for an object without values."""
        trackable = reached.trackable
        values = trackable._serialize_to_tensors() if has_values(trackable) else {}
        if not values:
            return {}, ""
        optional = trackable._optional_tensor_names() if len(values) > 1 else frozenset()
        keys: dict[str, str] = {}
        problems = []
        for value_name in values:
            key = self._key(reached, value_name, len(values) == 1)
            if key is not None and self.index.has_tensor(key):
                keys[value_name] = key
            elif value_name not in optional:
                problems.append(
                    f"no TF1 name for its value {self._object_key(reached, value_name)!r}"
                    if key is None
                    else f"the checkpoint has no key {key!r}"
                )
        if problems or not keys:
            return None, f"{_readable(reached.path)} ({trackable!r}): {'; '.join(problems)}"
        return keys, ""

    # -- restoring ---------------------------------------------------------------------------

    def restore(self, reached: Sequence[_Reached]) -> None:
        """Restore every object of ``reached`` the checkpoint names; then wait on all of them.

        Raises:
            InvalidArgumentError, DataLossError: a value does not fit or is damaged; then
                nothing changed and nothing waits.
        """
        uid = self.restore_uid
        items: list[RestoreItem] = []
        unmatched: list[tuple[Trackable, str]] = []
        for one in reached:
            if one.trackable._update_uid >= uid:
                continue  # restored by this load already, or by a more recent one
            keys, why = self._match(one)
            if keys:
                items.append(RestoreItem(one.trackable, keys, _readable(one.path)))
            elif keys is None and one.path != (SAVE_COUNTER,):
                unmatched.append((one.trackable, why))
        if items:
            with self.index.reopen() as reader:
                restore_items(items, reader, prefix=self.prefix)
        state = self._warning
        for item in items:
            item.trackable._update_uid = uid
            state.used.update(item.keys.values())
            state.unmatched.pop(id(item.trackable), None)
        for trackable, why in unmatched:
            state.unmatched[id(trackable)] = why
        for one in reached:
            self._wait_on(one)

    def _wait_on(self, reached: _Reached) -> None:
        """Restore children attached to ``reached`` later (variables never get children)."""
        trackable = reached.trackable
        if isinstance(trackable, Variable):
            return
        waiting = trackable._name_based_restorations
        if not any(isinstance(w, _Position) and w.coordinator is self for w in waiting):
            waiting.append(_Position(self, reached.path, reached.scope))

    def unrestored(self, view: ObjectGraphView) -> list[str]:
        """Why each reachable object that owns values did not get them from this load."""
        out = []
        for one in _walk(view, (), None):
            if one.trackable._update_uid >= self.restore_uid or one.path == (SAVE_COUNTER,):
                continue
            keys, why = self._match(one)
            if keys is None:
                out.append(why)
            elif keys:
                out.append(
                    f"{_readable(one.path)} ({one.trackable!r}): its values are in the "
                    "checkpoint, but it was attached without being offered to this restore "
                    "(a torch submodule registered later, or a Checkpoint's attached child)"
                )
        return out


class _Position:
    """A name-based restore waiting on one object for children (``NameBasedRestoration``)."""

    __slots__ = ("coordinator", "path", "scope")

    def __init__(
        self, coordinator: NameBasedRestore, path: tuple[str, ...], scope: int | None
    ) -> None:
        self.coordinator = coordinator
        self.path = path
        self.scope = scope

    def __deepcopy__(self, memo: dict[int, Any]) -> _Position:
        return self

    @property
    def restore_uid(self) -> int:
        return self.coordinator.restore_uid

    def restore_child(self, name: str, trackable: Trackable) -> None:
        # docstring inherited
        reached = _walk(ObjectGraphView(trackable), (*self.path, name), self.scope)
        self.coordinator.restore(reached)


def restore_name_based(
    view: ObjectGraphView, prefix: str, options: CheckpointOptions, *, index: BundleReader
) -> NameBasedSaverStatus:
    """Restore the objects of ``view`` from the name-based checkpoint ``prefix`` (module doc).

    Args:
        view: the Checkpoint's object graph.
        prefix: the checkpoint (resolved).
        options: restore options (``name_map``).
        index: the checkpoint's reader, possibly closed.

    Raises:
        InvalidArgumentError: a value does not fit its object (nothing changed).
        DataLossError: a value is damaged (nothing changed).
    """
    coordinator = NameBasedRestore(prefix, index, options.name_map)
    try:
        coordinator.restore(_walk(view, (), None))
    except BaseException:
        coordinator.expect_partial = True  # the error says it all; no "unrestored" warning
        raise
    return NameBasedSaverStatus(coordinator, view)
