"""Lazy snapshots in the saving layer: deferred copies, gates, version checks (issue 29).

A stand-in planner defers the values of ``Versioned`` holders (a numpy array with a counter
bumped by every change) and gates them on a ``Gate`` the test fires like an optimizer step.
The writer thread is held before it finishes the copies (``hold_writer``), so each test decides
what happens between the call and the copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver, ShardableTensor
from trackpoint.saving import lazy_snapshot as lazy_module
from trackpoint.saving.async_writer import AsyncWriter
from trackpoint.saving.lazy_snapshot import DeferredValue, LazyCopy, LazyPlan

LAZY = CheckpointOptions(enable_async=True, lazy_snapshot=True)


class Versioned:
    """A value that only ``change`` writes, counting its changes (a torch tensor's _version)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.version = 0

    def change(self, delta: float) -> None:
        self.array += delta
        self.version += 1


class Gate:
    """What would change the deferred values next (an optimizer step)."""

    def __init__(self) -> None:
        self.pending: list[tuple[LazyCopy, tuple[int, ...]]] = []

    def before_change(self) -> None:
        waiting, self.pending = self.pending, []
        for copy, indices in waiting:
            copy.ensure(indices)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()

    def planner(tensors: Sequence[ShardableTensor]) -> LazyPlan | None:
        deferred = {
            i: DeferredValue(lambda v=st.trackable: v.version, st.checkpoint_key)
            for i, st in enumerate(tensors) if isinstance(st.trackable, Versioned)
        }  # fmt: skip
        return LazyPlan(deferred, lambda copy: gate.pending.append((copy, tuple(deferred))))

    monkeypatch.setattr(lazy_module, "_PLANNERS", [planner])
    return gate


@pytest.fixture
def hold_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The writer thread waits for this event before finishing a lazy snapshot's copies."""
    release = threading.Event()
    real = LazyCopy.complete

    def held(self: LazyCopy):  # noqa: ANN202
        assert release.wait(30)
        return real(self)

    monkeypatch.setattr(LazyCopy, "complete", held)
    yield release
    release.set()


def _read(prefix: str, key: str) -> np.ndarray:
    with BundleReader(prefix) as reader:
        return reader.read(key)


def _saver(weights: Versioned, buffer: np.ndarray) -> MultiDeviceSaver:
    return MultiDeviceSaver({weights: {"w": weights.array}, None: {"buffer": buffer}})


def test_options_refuse_lazy_without_async_or_with_staging() -> None:
    with pytest.raises(InvalidArgumentError, match="needs enable_async=True"):
        CheckpointOptions(lazy_snapshot=True)
    with pytest.raises(InvalidArgumentError, match="max_staging_bytes"):
        CheckpointOptions(enable_async=True, lazy_snapshot=True, max_staging_bytes=1024)
    with pytest.raises(InvalidArgumentError, match="must be a bool"):
        CheckpointOptions(enable_async=True, lazy_snapshot=1)  # type: ignore[arg-type]


def test_j1_lazy_deferred_value_is_copied_before_the_gate_changes_it(
    prefix: str, gate: Gate, hold_writer: threading.Event
) -> None:
    weights, buffer = Versioned(np.zeros(256, np.float32)), np.zeros(4, np.float32)
    writer = AsyncWriter()
    writer.save(_saver(weights, buffer), prefix, LAZY)
    buffer += 7  # not deferred: copied at the call
    assert gate.pending, "the deferred value must be gated"
    gate.before_change()  # the "step" copies the value itself: the writer thread is held
    weights.change(1.0)
    hold_writer.set()
    writer.sync()
    np.testing.assert_array_equal(_read(prefix, "w"), np.zeros(256))
    np.testing.assert_array_equal(_read(prefix, "buffer"), np.zeros(4))
    writer.close()


def test_j1_lazy_value_changed_outside_the_gate_fails_the_save(
    prefix: str, gate: Gate, hold_writer: threading.Event
) -> None:
    weights = Versioned(np.zeros(256, np.float32))
    writer = AsyncWriter()
    writer.save(_saver(weights, np.zeros(4, np.float32)), prefix, LAZY)
    weights.change(1.0)  # not through the gate, before the copy
    hold_writer.set()
    with pytest.raises(FailedPreconditionError, match="changed after save\\(\\) returned"):
        writer.sync()
    with pytest.raises(FileNotFoundError):
        _read(prefix, "w")  # nothing was committed
    writer.save(_saver(weights, np.zeros(4, np.float32)), prefix + "-2", LAZY)
    writer.sync()  # the error was reported once; the next save works
    np.testing.assert_array_equal(_read(prefix + "-2", "w"), np.ones(256))
    writer.close()


def test_j1_lazy_writer_thread_copies_values_no_gate_asked_for(prefix: str, gate: Gate) -> None:
    weights = Versioned(np.arange(64, dtype=np.float64))
    writer = AsyncWriter()
    writer.save(_saver(weights, np.zeros(4, np.float32)), prefix, LAZY)
    writer.sync()
    gate.before_change()  # after the copy: nothing left to do
    weights.change(5.0)
    np.testing.assert_array_equal(_read(prefix, "w"), np.arange(64))
    writer.close()


def test_lazy_copy_reuses_buffers_and_is_copied_once(gate: Gate) -> None:
    weights = Versioned(np.ones(16, np.float32))
    saver = _saver(weights, np.zeros(4, np.float32))
    buffers: dict[tuple[str, str], np.ndarray] = {}
    first = LazyCopy(saver.snapshot(), buffers, lazy_module.plan_lazy(
        saver.snapshot().tensors_by_task[""]))  # fmt: skip
    assert first.deferred_count == 1 and not first.finished
    gate.before_change()
    assert first.finished
    done = first.complete()
    kept = dict(buffers)
    second = LazyCopy(saver.snapshot(), buffers, lazy_module.plan_lazy(
        saver.snapshot().tensors_by_task[""]))  # fmt: skip
    again = second.complete()
    by_key = {st.checkpoint_key: st.tensor for st in again.tensors_by_task[""]}
    assert by_key["w"] is kept[("w", "")]  # the earlier copy's buffer, overwritten
    assert {st.checkpoint_key for st in done.tensors_by_task[""]} == {"w", "buffer"}
