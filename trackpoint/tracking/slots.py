"""Slot relations: optimizer state kept per variable (semantics F1–F4).

A slot variable belongs to neither the variable nor the optimizer alone: it is saved only if
both are reachable from the root, under
``<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>/.ATTRIBUTES/VARIABLE_VALUE``,
and listed on the optimizer's node (tf-checkpoint-format.md §9.2–9.3). :class:`SlotOwner` is
the mixin an optimizer-like trackable uses to declare such state; the graph walker and the
restore coordinator find slots through its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, DeferredRestoration, Trackable
from trackpoint.tracking.variable import Variable

__all__ = ["PendingSlot", "SlotOwner"]


def _slot_target(variable: Any) -> Trackable:
    target = to_trackable(variable)
    if target is None:
        raise InvalidArgumentError(
            f"slots are kept per trackable variable; {type(variable).__name__} is neither a "
            "Trackable nor a type with a registered adapter"
        )
    return target


class SlotOwner(Trackable):
    """Mixin for optimizer-like trackables with per-variable state ("slots").

    Create slots with :meth:`add_slot`; a slot whose value waits in a pending restore is
    created with the saved value. When a checkpoint is restored while the optimizer and the
    variable both exist, missing slots are created from the checkpoint at once.
    Non-slot state (step counters, ``beta1_power``) is ordinary children.
    """

    def _slot_table(self) -> dict[str, dict[int, tuple[Trackable, Variable]]]:
        table = self.__dict__.get("_self_slots")
        if table is None:
            table = {}
            object.__setattr__(self, "_self_slots", table)
            object.__setattr__(self, "_self_deferred_slots", {})
        return table

    def _deferred_slot_table(self) -> dict[tuple[str, int], list[DeferredRestoration]]:
        self._slot_table()
        return self.__dict__["_self_deferred_slots"]  # type: ignore[no-any-return]

    def _slot_variables(self) -> list[tuple[str, Any]]:
        """``(description, variable)`` of every variable this optimizer keeps state for.

        A save fails if one of them is not reachable from the checkpoint's root, naming it by
        its description (e.g. ``"parameter 2 of param_groups[0] (shape (3,))"``). The default
        lists none: as in TensorFlow (semantics F1), slots of variables the root does not reach
        are not saved. Optimizers whose variables' values would be lost with their state (the
        torch adapter) list them all.
        """
        return []

    def get_slot_names(self) -> list[str]:
        """Slot names in save order (sorted, as TensorFlow's v1 optimizers list them)."""
        return sorted(self._slot_table())

    def get_slot(self, variable: Any, slot_name: str) -> Variable | None:
        """The slot ``slot_name`` of ``variable``, or None."""
        target = to_trackable(variable)
        if target is None:
            return None
        entry = self._slot_table().get(slot_name, {}).get(id(target))
        return entry[1] if entry is not None else None

    def add_slot(
        self,
        variable: Any,
        slot_name: str,
        initial_value: Any = None,
        *,
        dtype: Any = None,
    ) -> Variable:
        """The slot ``slot_name`` of ``variable``, created if missing.

        A new slot starts from the checkpoint value if a restore is waiting for it, else from
        ``initial_value`` (zeros shaped like the variable if None).
        """
        target = _slot_target(variable)
        existing = self.get_slot(target, slot_name)
        if existing is not None:
            return existing
        pending = self._deferred_slot_table().pop((slot_name, id(target)), [])
        spec = max(pending, key=lambda p: p.restore_uid).value_spec() if pending else None
        if spec is not None:
            value: Any = np.zeros(spec[0], dtype=dtype if dtype is not None else spec[1])
        elif initial_value is None:
            template = np.asarray(target._serialize_to_tensors().get(VARIABLE_VALUE_KEY, 0.0))
            value = np.zeros(template.shape, dtype=dtype if dtype is not None else template.dtype)
        else:
            value = initial_value() if callable(initial_value) else initial_value
        slot = Variable(value, dtype=dtype, name=f"{slot_name}")
        self._slot_table().setdefault(slot_name, {})[id(target)] = (target, slot)
        for position in sorted(pending, key=lambda p: p.restore_uid, reverse=True):
            position.restore(slot)
        return slot

    def _plan_slot_variable(
        self, slot_variable_position: DeferredRestoration, variable: Trackable, slot_name: str
    ) -> Trackable | None:
        """Called by the restore engine when a checkpoint holds a slot of ``variable``.

        Returns the slot to restore: the existing one, or a :class:`PendingSlot` that creates
        it from the checkpoint's value once every value of the restore is verified. None when
        the checkpoint gives no value to create it from (the engine then calls
        :meth:`_defer_slot_variable` after the restore). Must not change the optimizer.
        """
        slot = self.get_slot(variable, slot_name)
        if slot is not None:
            return slot
        spec = slot_variable_position.value_spec()
        if spec is None:
            return None
        shape, dtype = spec

        def create(value: np.ndarray) -> Trackable:
            created = Variable(np.array(value, copy=True), name=slot_name)
            self._slot_table().setdefault(slot_name, {})[id(variable)] = (variable, created)
            return created

        return PendingSlot(shape, dtype, create, what=f"slot {slot_name!r}")

    def _defer_slot_variable(
        self, slot_variable_position: DeferredRestoration, variable: Trackable, slot_name: str
    ) -> None:
        """Keep a slot's restore until :meth:`add_slot` creates the slot."""
        self._deferred_slot_table().setdefault((slot_name, id(variable)), []).append(
            slot_variable_position
        )


class PendingSlot(Trackable):
    """A slot the checkpoint holds and the optimizer lacks, created when the restore applies.

    Planning a restore must not change the optimizer (a failed restore changes nothing), so
    the engine restores this placeholder instead: its checks run with every other object's,
    and its apply step calls ``create(value)``, which adds the real slot to the optimizer.

    Args:
        shape: the saved shape.
        dtype: the saved numpy dtype.
        create: makes the slot from the verified value (a view valid during the call: copy it)
            and returns its trackable.
        what: the slot, for messages.
    """

    def __init__(
        self, shape: tuple[int, ...], dtype: np.dtype[Any],
        create: Callable[[np.ndarray], Trackable], *, what: str,
    ) -> None:
        self._shape = tuple(shape)
        self._dtype = np.dtype(dtype)
        self._create = create
        self._what = what
        self.created: Trackable | None = None

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited: a zero-strided stand-in of the saved shape (allocates nothing)
        return {VARIABLE_VALUE_KEY: np.broadcast_to(np.zeros((), self._dtype), self._shape)}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved = np.asarray(restored_tensors[VARIABLE_VALUE_KEY])
        if saved.shape != self._shape or saved.dtype != self._dtype:
            raise InvalidArgumentError(
                f"{self._what}: the checkpoint's value has shape {saved.shape} and dtype "
                f"{saved.dtype}, its index says {self._shape} and {self._dtype}"
            )

        def apply() -> None:
            self.created = self._create(saved)

        return apply

    def __repr__(self) -> str:
        return f"<PendingSlot {self._what} shape={self._shape} dtype={self._dtype}>"
