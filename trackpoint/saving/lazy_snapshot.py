"""Lazy snapshots: an async save whose copies of optimizer-owned values run after it returns.

``CheckpointOptions(enable_async=True, lazy_snapshot=True)``. An ordinary async save copies
every value before ``save`` returns: about one memory copy of the state on the caller's thread.
Most of that state (parameters, optimizer state) changes only at the next optimizer step, which
comes a whole forward and backward pass later. A lazy snapshot copies at the call only what may
change sooner (buffers such as running statistics, RNG states, plain values, everything no
tracked optimizer owns) and leaves the rest to the writer thread; the optimizer's next step
first waits for, or takes over, the copies of exactly the values it will change.

Which values may wait, and what guards them, is decided by the registered *lazy planners*
(:func:`register_lazy_planner`; the torch integration registers one that knows optimizers and
their ``register_step_pre_hook``). Without a planner that claims a value, it is copied at the
call, as in an ordinary async save.

Safety: the checkpoint holds exactly the values at the call, or the save fails. Each deferred
value carries a version counter read at the call (torch's ``tensor._version``); it is read again
before and after its copy, and a copy whose counter moved (an EMA update, ``p.mul_()`` under
``no_grad``, an optimizer nobody tracked) fails the save through the async error path: the
writer thread raises ``FailedPreconditionError`` naming the value, and the next ``sync()`` or
``save()`` raises it. Changes a counter does not see are the documented blind spots
(docs/performance.md, "Lazy snapshots"): writes through ``tensor.data`` or a numpy view, fused
kernels that do not bump counters, and an in-place operation still running on another thread
at the very moment a copy's counter is read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import numpy as np

from trackpoint.errors import FailedPreconditionError
from trackpoint.saving.devices import LOCAL_TASK
from trackpoint.saving.sharding import ShardableTensor
from trackpoint.saving.snapshot import SaveSnapshot

__all__ = [
    "DeferredValue",
    "LazyCopy",
    "LazyPlan",
    "LazyPlanner",
    "plan_lazy",
    "register_lazy_planner",
]

logger = logging.getLogger(__name__)

_PENDING, _COPYING, _DONE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class DeferredValue:
    """A value whose copy may wait: only its planner's gates change it before it is copied.

    Attributes:
        version: reads the live value's version counter; any change moves it (a planner must
            not defer a value it cannot count changes of).
        what: the value, for messages (``"parameter '0.weight'"``).
    """

    version: Callable[[], int]
    what: str


@dataclass(frozen=True, slots=True)
class LazyPlan:
    """A planner's answer for one save's local values.

    Attributes:
        deferred: position in the local task's value list -> how to guard it.
        arm: called once the :class:`LazyCopy` exists, on the caller's thread: attaches it to
            whatever will next change the deferred values (optimizer step pre-hooks), which
            must call :meth:`LazyCopy.ensure` with those positions first.
    """

    deferred: Mapping[int, DeferredValue]
    arm: Callable[[LazyCopy], None]


LazyPlanner = Callable[[Sequence[ShardableTensor]], "LazyPlan | None"]
"""Given one save's local values, the ones it can defer (or None for none)."""

_PLANNERS: list[LazyPlanner] = []


def register_lazy_planner(planner: LazyPlanner) -> None:
    """Let lazy snapshots defer the values ``planner`` claims (idempotent)."""
    if planner not in _PLANNERS:
        _PLANNERS.append(planner)


def plan_lazy(tensors: Sequence[ShardableTensor]) -> list[LazyPlan]:
    """Every registered planner's plan for ``tensors``; a position claimed twice keeps the first."""
    plans: list[LazyPlan] = []
    claimed: set[int] = set()
    for planner in _PLANNERS:
        plan = planner(tensors)
        if plan is None or not plan.deferred:
            continue
        overlap = claimed.intersection(plan.deferred)
        if overlap:
            plan = LazyPlan({i: v for i, v in plan.deferred.items() if i not in overlap}, plan.arm)
        claimed.update(plan.deferred)
        plans.append(plan)
    return plans


def _copy_array(st: ShardableTensor, old: Mapping[tuple[str, str], np.ndarray]) -> np.ndarray:
    """A private C-ordered copy of ``st``'s array, into an earlier buffer when one fits."""
    buffer = old.get((st.checkpoint_key, st.slice_spec))
    if buffer is not None and buffer.shape == st.tensor.shape and buffer.dtype == st.tensor.dtype:
        np.copyto(buffer, st.tensor)
        return buffer
    return np.array(st.tensor, copy=True, order="C")


class LazyCopy:
    """One lazy snapshot: copied at the call except the deferred values, finished later.

    Thread-safe. The writer thread calls :meth:`complete`; gates (optimizer step pre-hooks,
    on the training thread) call :meth:`ensure`. Each deferred value is copied exactly once, by
    whichever thread claims it first; the other waits for it.

    Args:
        snapshot: the evaluated values (live arrays, not copies).
        buffers: arrays of the previous snapshot to reuse, by (checkpoint key, slice spec);
            updated to hold exactly this snapshot's copies, as :meth:`SaveSnapshot.copy`.
        plans: from :func:`plan_lazy` on the snapshot's local values.
    """

    def __init__(
        self,
        snapshot: SaveSnapshot,
        buffers: MutableMapping[tuple[str, str], np.ndarray],
        plans: Sequence[LazyPlan],
    ) -> None:
        self._old = dict(buffers)
        buffers.clear()
        self._buffers = buffers
        self._cond = threading.Condition()
        local = list(snapshot.tensors_by_task.get(LOCAL_TASK, ()))
        self._live: list[ShardableTensor] | None = local
        self._guards: dict[int, tuple[DeferredValue, int]] = {}
        for plan in plans:
            for index, value in plan.deferred.items():
                self._guards[index] = (value, value.version())
        self._state = [_DONE] * len(local)
        self._copies: list[ShardableTensor] = list(local)
        self._error: FailedPreconditionError | None = None
        # Everything that cannot wait is copied now, on the caller's thread.
        self.immediate_bytes = 0
        for index, st in enumerate(local):
            if index in self._guards:
                self._state[index] = _PENDING
            else:
                self._copies[index] = self._copied(st)
                self.immediate_bytes += st.tensor.nbytes
        self._others: dict[str, list[ShardableTensor]] = {}
        for task, tensors in snapshot.tensors_by_task.items():
            if task != LOCAL_TASK:
                self._others[task] = [self._copied(st) for st in tensors]
                self.immediate_bytes += sum(st.tensor.nbytes for st in tensors)
        self._tasks = list(snapshot.tensors_by_task)
        for plan in plans:
            plan.arm(self)

    @property
    def deferred_count(self) -> int:
        """How many values were left to copy after the call."""
        return len(self._guards)

    @property
    def finished(self) -> bool:
        """True once every deferred value is copied (or the save failed)."""
        with self._cond:
            return self._live is None or all(s == _DONE for s in self._state)

    def _copied(self, st: ShardableTensor) -> ShardableTensor:
        buffer = _copy_array(st, self._old)
        with self._cond:
            self._buffers[(st.checkpoint_key, st.slice_spec)] = buffer
        return st._replace(tensor=buffer)

    def _claim(self, index: int) -> ShardableTensor | None:
        """The live value at ``index`` if this thread is to copy it; None if another does/did."""
        with self._cond:
            if self._live is None or self._state[index] != _PENDING:
                return None
            self._state[index] = _COPYING
            return self._live[index]

    def _copy_deferred(self, index: int, st: ShardableTensor) -> None:
        """Copy one claimed value and check that nothing changed it since the call."""
        value, at_call = self._guards[index]
        copied: ShardableTensor | None = None
        error: FailedPreconditionError | None = None
        try:
            before = value.version()
            if before == at_call:
                copied = self._copied(st)
                after = value.version()
            else:
                after = before
            if after != at_call:
                copied = None
                error = FailedPreconditionError(
                    f"lazy snapshot of {st.checkpoint_key!r} ({value.what}) failed: the value "
                    f"changed after save() returned and before its copy was done (version "
                    f"{at_call} at the call, {after} now), and not through a tracked "
                    "optimizer's step(). This checkpoint is not written. Track every optimizer "
                    "that updates it in the Checkpoint, call sync() before changing it outside "
                    "an optimizer (EMA, p.mul_() under no_grad), or save without "
                    "lazy_snapshot",
                    key=st.checkpoint_key,
                )
        except BaseException as exc:  # reported by complete(); a gate must not raise
            error = FailedPreconditionError(
                f"lazy snapshot of {st.checkpoint_key!r} ({value.what}) failed while copying: "
                f"{exc!r}; this checkpoint is not written",
                key=st.checkpoint_key,
            )
        with self._cond:
            if copied is not None:
                self._copies[index] = copied
            if error is not None and self._error is None:
                self._error = error
            self._state[index] = _DONE
            self._cond.notify_all()

    def ensure(self, indices: Sequence[int]) -> None:
        """Make sure the values at ``indices`` are copied: copy them here, or wait for them.

        Called by a gate right before it changes them (an optimizer's step pre-hook). Never
        raises: a changed value fails the save, reported by :meth:`complete`.
        """
        for index in indices:
            st = self._claim(index)
            if st is not None:
                self._copy_deferred(index, st)
        with self._cond:
            self._cond.wait_for(lambda: all(self._state[i] == _DONE for i in indices))

    def complete(self) -> SaveSnapshot:
        """On the writer thread: copy what is left, then the snapshot of private copies.

        Raises:
            FailedPreconditionError: a deferred value changed before its copy was done (the
                checkpoint must not be written).
        """
        for index in self._guards:
            st = self._claim(index)
            if st is not None:
                self._copy_deferred(index, st)
        with self._cond:
            self._cond.wait_for(lambda: all(s == _DONE for s in self._state))
            self._live = None  # the live arrays (torch tensors) are no longer held
            self._old = {}
            error = self._error
        if error is not None:
            logger.error("%s", error)
            raise error
        by_task: dict[str, list[ShardableTensor]] = {}
        for task in self._tasks:
            by_task[task] = self._copies if task == LOCAL_TASK else self._others[task]
        return SaveSnapshot(by_task)

    def abandon(self, error: BaseException | None = None) -> None:
        """Drop the live values without copying (the save failed, ``error``, or never began)."""
        with self._cond:
            self._live = None
            self._state = [_DONE] * len(self._state)
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (
            f"LazyCopy({len(self._guards)} deferred, {'finished' if self.finished else 'copying'})"
        )
