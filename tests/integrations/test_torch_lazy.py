"""Lazy snapshots of torch state (issue 29): step pre-hooks, version checks, composition.

Every test compares the checkpoint with copies taken at the save call. The writer thread is
held before it finishes the deferred copies (``hold_writer``) wherever the test needs training
to run first, so what the test checks does not depend on thread timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

import trackpoint as tp
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.integrations.torch_lazy import step_gate
from trackpoint.management import CheckpointReader
from trackpoint.saving.lazy_snapshot import LazyCopy

LAZY = tp.CheckpointOptions(enable_async=True, lazy_snapshot=True)


@pytest.fixture
def hold_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The writer thread waits for this event before finishing a lazy snapshot's copies."""
    release = threading.Event()
    real = LazyCopy.complete

    def held(self: LazyCopy):  # noqa: ANN202
        assert release.wait(60)
        return real(self)

    monkeypatch.setattr(LazyCopy, "complete", held)
    yield release
    release.set()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def _train(model: nn.Module, *optimizers: torch.optim.Optimizer, steps: int = 1) -> None:
    for _ in range(steps):
        for optimizer in optimizers:
            optimizer.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        for optimizer in optimizers:
            optimizer.step()


def _values_now(ckpt: tp.Checkpoint, prefix: str) -> dict[str, np.ndarray]:
    """Copies of every tensor value of ``ckpt`` now, by checkpoint key (a sync write + read)."""
    ckpt.write(prefix)
    reader = CheckpointReader(prefix)
    return {
        key: np.array(reader.get_tensor(key), copy=True)
        for key in reader.get_variable_to_shape_map()
        if "VARIABLE_VALUE" in key
    }


def _assert_holds(prefix: str, expected: dict[str, np.ndarray]) -> None:
    reader = CheckpointReader(prefix)
    for key, value in expected.items():
        np.testing.assert_array_equal(reader.get_tensor(key), value, err_msg=key)


@pytest.mark.parametrize("kernel", [{"foreach": False}, {"foreach": True}, {"fused": True}])
def test_j1_lazy_checkpoint_holds_the_values_at_the_call(tmp_path, hold_writer, kernel) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, **kernel)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    expected = _values_now(ckpt, str(tmp_path / "reference"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    # Training goes on while the writer thread is held: forward changes the BatchNorm
    # statistics (copied at the call); step() changes parameters and Adam state (its pre-hook
    # copies them first).
    _train(model, optimizer, steps=3)
    assert step_gate(optimizer).calls >= 1
    hold_writer.set()
    ckpt.sync()
    _assert_holds(prefix, expected)
    assert not np.array_equal(
        model[0].weight.detach().numpy(),
        expected["model/0/weight/.ATTRIBUTES/VARIABLE_VALUE"],
    )  # training did move on


def test_lazy_defers_only_what_tracked_optimizers_own(tmp_path, hold_writer) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    ckpt.write(str(tmp_path / "lazy"), LAZY)
    (indices,) = [indices for _, indices in step_gate(optimizer)._waiting]
    # 6 parameters + 6 momentum buffers; BatchNorm's running statistics (and its
    # num_batches_tracked) are copied at the call.
    assert len(indices) == 12
    hold_writer.set()
    ckpt.sync()


def test_lazy_without_a_tracked_optimizer_copies_everything_at_the_call(tmp_path) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model)  # the optimizer is not in the checkpoint
    expected = _values_now(ckpt, str(tmp_path / "reference"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    _train(model, optimizer, steps=2)  # an untracked step cannot reach a copy made at the call
    ckpt.sync()
    _assert_holds(prefix, expected)
    assert not step_gate(optimizer).pending


@pytest.mark.parametrize(
    "change",
    ["ema_mul_under_no_grad", "untracked_second_optimizer", "restore_into_the_model"],
)
def test_lazy_outside_change_before_the_copy_fails_the_save(tmp_path, hold_writer, change) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    other = tp.Checkpoint(model=model)
    earlier = other.write(str(tmp_path / "earlier"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    if change == "ema_mul_under_no_grad":
        with torch.no_grad():
            model[0].weight.mul_(0.5)
    elif change == "untracked_second_optimizer":
        second = torch.optim.SGD(model[3].parameters(), lr=1.0)
        second.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        second.step()
    else:
        other.read(earlier)
    hold_writer.set()
    with pytest.raises(FailedPreconditionError, match="changed after save\\(\\) returned"):
        ckpt.sync()
    assert not os.path.exists(prefix + ".index")
    ckpt.write(str(tmp_path / "after"), LAZY)  # the error was reported; saving goes on
    ckpt.sync()


def test_lazy_outside_change_after_the_copy_is_fine(tmp_path) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    expected = _values_now(ckpt, str(tmp_path / "reference"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    ckpt.sync()  # every copy done
    with torch.no_grad():
        model[0].weight.mul_(0.5)
    ckpt.sync()
    _assert_holds(prefix, expected)


def test_lazy_with_two_tracked_optimizers(tmp_path, hold_writer) -> None:  # noqa: ANN001
    model = _model()
    first = torch.optim.Adam(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD([*model[1].parameters(), *model[3].parameters()], lr=0.1, momentum=0.9)
    _train(model, first, second)
    ckpt = tp.Checkpoint(model=model, first=first, second=second)
    expected = _values_now(ckpt, str(tmp_path / "reference"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    _train(model, first, second, steps=2)
    assert step_gate(first).calls >= 1 and step_gate(second).calls >= 1
    hold_writer.set()
    ckpt.sync()
    _assert_holds(prefix, expected)


def test_lazy_composes_with_checkpoint_manager(tmp_path, hold_writer) -> None:  # noqa: ANN001
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    expected = _values_now(tp.Checkpoint(model=model, optimizer=optimizer),
                           str(tmp_path / "reference"))  # fmt: skip
    with tp.CheckpointManager(ckpt, str(tmp_path / "run"), max_to_keep=2) as manager:
        prefix = manager.save(options=LAZY)
        _train(model, optimizer, steps=2)
        hold_writer.set()
        ckpt.sync()
        assert manager.latest_checkpoint == prefix
    _assert_holds(prefix, expected)


def test_lazy_composes_with_incremental_saves(tmp_path) -> None:  # noqa: ANN001
    model = _model()
    frozen = nn.Linear(64, 64)  # not optimized: unchanged between the saves, linked
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    _train(model, optimizer)
    ckpt = tp.Checkpoint(model=model, frozen=frozen, optimizer=optimizer)
    options = tp.CheckpointOptions(enable_async=True, lazy_snapshot=True, incremental=True)
    ckpt.write(str(tmp_path / "one"), options)
    _train(model, optimizer)
    expected = _values_now(tp.Checkpoint(model=model, frozen=frozen, optimizer=optimizer),
                           str(tmp_path / "reference"))  # fmt: skip
    prefix = ckpt.write(str(tmp_path / "two"), options)
    _train(model, optimizer, steps=2)
    ckpt.sync()
    _assert_holds(prefix, expected)


def test_lazy_with_a_compiled_model(tmp_path, hold_writer) -> None:  # noqa: ANN001
    model = _model()
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.Adam(compiled.parameters(), lr=0.1)
    _train(compiled, optimizer)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    expected = _values_now(ckpt, str(tmp_path / "reference"))
    prefix = ckpt.write(str(tmp_path / "lazy"), LAZY)
    _train(compiled, optimizer, steps=2)
    hold_writer.set()
    ckpt.sync()
    _assert_holds(prefix, expected)


def test_lazy_refuses_max_staging_bytes() -> None:
    with pytest.raises(InvalidArgumentError, match="max_staging_bytes"):
        tp.CheckpointOptions(enable_async=True, lazy_snapshot=True, max_staging_bytes=1 << 20)
