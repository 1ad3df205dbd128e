"""Slot relations: optimizer state kept per variable (semantics F1–F4).

A slot variable belongs to neither the variable nor the optimizer alone: it is saved only if
both are reachable from the root, under
``<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>/.ATTRIBUTES/VARIABLE_VALUE``,
and listed on the optimizer's node (tf-checkpoint-format.md §9.2–9.3). :class:`SlotOwner` is
the mixin an optimizer-like trackable uses to declare such state; the graph walker and the
restore coordinator find slots through its methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, DeferredRestoration, Trackable
from trackpoint.tracking.variable import Variable

__all__ = ["SlotOwner"]


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
        return table  # type: ignore[no-any-return]

    def _deferred_slot_table(self) -> dict[tuple[str, int], list[DeferredRestoration]]:
        self._slot_table()
        return self.__dict__["_self_deferred_slots"]  # type: ignore[no-any-return]

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

    def _create_or_restore_slot_variable(
        self, slot_variable_position: DeferredRestoration, variable: Trackable, slot_name: str
    ) -> Trackable | None:
        """Called by the restore coordinator when a checkpoint holds a slot of ``variable``.

        Returns the slot to restore now (existing, or created from the checkpoint), or None
        after keeping the position for :meth:`add_slot`.
        """
        slot = self.get_slot(variable, slot_name)
        if slot is None and slot_variable_position.value_spec() is not None:
            shape, dtype = slot_variable_position.value_spec()  # type: ignore[misc]
            slot = Variable(np.zeros(shape, dtype=dtype), name=slot_name)
            self._slot_table().setdefault(slot_name, {})[id(variable)] = (variable, slot)
        if slot is None:
            self._deferred_slot_table().setdefault((slot_name, id(variable)), []).append(
                slot_variable_position
            )
        return slot
