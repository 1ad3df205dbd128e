"""Restoring many plain variables takes one pass per list (issue 19); what it restores, binds
and rejects is what the walk node by node gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.checkpoint import restore as restore_module

COUNT = 5000  # more than one window of the bulk pass


def _values() -> dict[str, np.ndarray]:
    values = {f"layer{i // 100}/w.{i}": np.full(1 + i % 3, float(i)) for i in range(COUNT)}
    values["alias"] = values["layer7/w.700"]  # one node, reached under two names
    return values


def test_many_variables_restore_in_place(tmp_path: Path) -> None:
    values = _values()
    prefix = tp.Checkpoint(state=values).write(str(tmp_path / "ckpt"))
    targets = {key: np.zeros_like(value) for key, value in values.items()}
    targets["alias"] = targets["layer7/w.700"]
    before = {key: id(target) for key, target in targets.items()}
    tp.Checkpoint(state=targets).read(prefix).assert_consumed()
    for key, value in values.items():
        np.testing.assert_array_equal(targets[key], value)
        assert id(targets[key]) == before[key]


def test_bulk_and_node_by_node_plans_are_equal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = _values()
    prefix = tp.Checkpoint(state=values).write(str(tmp_path / "ckpt"))

    def plan_of() -> tuple[list[str], list[int]]:
        targets = {key: np.zeros_like(value) for key, value in values.items()}
        targets["alias"] = targets["layer7/w.700"]
        status = tp.Checkpoint(state=targets).read(prefix)
        status.assert_consumed()
        names = [key for key in targets if not np.any(targets[key] != values[key])]
        return names, sorted(status._coordinator.matched_proto_ids)  # type: ignore[attr-defined]

    fast = plan_of()
    monkeypatch.setattr(restore_module, "plan_leaves", lambda *args: 0)
    assert fast == plan_of()


def test_a_misfit_in_the_middle_changes_nothing(tmp_path: Path) -> None:
    values = _values()
    prefix = tp.Checkpoint(state=values).write(str(tmp_path / "ckpt"))
    targets = {key: np.zeros_like(value) for key, value in values.items()}
    targets["alias"] = targets["layer7/w.700"]
    targets["layer30/w.3000"] = np.zeros(7)  # another shape
    with pytest.raises(tp.errors.InvalidArgumentError, match="shape"):
        tp.Checkpoint(state=targets).read(prefix)
    assert all(not target.any() for target in targets.values())


def test_values_restored_by_a_newer_restore_are_kept(tmp_path: Path) -> None:
    values = _values()
    old = tp.Checkpoint(state=values).write(str(tmp_path / "old"))
    newer = {key: value + 1 for key, value in values.items()}
    new = tp.Checkpoint(state=newer).write(str(tmp_path / "new"))
    targets = {key: np.zeros_like(value) for key, value in values.items()}
    targets["alias"] = targets["layer7/w.700"]
    holder = tp.Checkpoint()
    first = holder.read(old)
    second = holder.read(new)  # both wait for the dict: the newer request wins (B4)
    holder.state = targets
    first.expect_partial()
    second.assert_consumed()
    for key, value in newer.items():
        np.testing.assert_array_equal(targets[key], value)
