"""A damaged value fails a distributed restore on every rank, and no rank's objects change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import tpd_corrupt  # noqa: E402
from test_dist_threads import checkpoint, run_ranks, sharded_values  # noqa: E402

from trackpoint.errors import CheckpointError  # noqa: E402


@pytest.mark.parametrize("damaged", ["shared", "table"])
def test_damaged_value_changes_nothing_on_any_rank(tmp_path: Path, damaged: str) -> None:
    def save(rank: int, collective: Any) -> str:
        return checkpoint(sharded_values(2, rank), collective).save(tmp_path / "ckpt")

    (prefix, _) = run_ranks(2, save)
    tpd_corrupt.corrupt(prefix, f"{damaged}/.ATTRIBUTES/VARIABLE_VALUE")

    def restore(rank: int, collective: Any) -> tuple[Any, ...]:
        values = sharded_values(2, rank, fill=-1)
        try:
            checkpoint(values, collective).restore(prefix)
        except CheckpointError as exc:
            return exc, values["_locals"]
        return None, values["_locals"]

    for error, (table, flat, shared) in run_ranks(2, restore):
        assert isinstance(error, CheckpointError)
        assert (table == -1).all() and (flat == -1).all() and (shared == 0).all()


def test_damaged_save_counter_changes_nothing_and_every_rank_saves_again(tmp_path: Path) -> None:
    """Issue 27 finding 1 over 2 thread ranks: the counter is verified with every other value,
    before any rank changes anything, and the ranks keep numbering, saving and restoring."""

    def save(rank: int, collective: Any) -> str:
        ckpt = checkpoint(sharded_values(2, rank), collective)
        ckpt.save(tmp_path / "good" / "ckpt")
        return ckpt.save(tmp_path / "good" / "ckpt")

    (good, _) = run_ranks(2, save)
    (damaged, _) = run_ranks(2, lambda rank, c: checkpoint(sharded_values(2, rank), c).save(
        tmp_path / "damaged" / "ckpt"))
    tpd_corrupt.corrupt(damaged, "save_counter/.ATTRIBUTES/VARIABLE_VALUE")

    def restore(rank: int, collective: Any) -> tuple[Any, ...]:
        values = sharded_values(2, rank, fill=-1)
        ckpt = checkpoint(values, collective)
        try:
            ckpt.restore(damaged)
        except CheckpointError as exc:
            error: Any = exc
        else:
            error = None
        table, flat, shared = values["_locals"]
        untouched = bool((table == -1).all() and (flat == -1).all() and (shared == 0).all())
        counter = int(ckpt.save_counter.numpy())
        again = ckpt.save(tmp_path / "again" / "ckpt")  # numbering starts over, at 1
        ckpt.restore(good).assert_consumed()
        return error, untouched, counter, again, int(ckpt.save_counter.numpy()), table.copy()

    for result in run_ranks(2, restore):
        assert not isinstance(result, BaseException), result
        error, untouched, counter, again, restored_counter, table = result
        assert isinstance(error, CheckpointError), error
        assert untouched and counter == 0
        assert again == str(tmp_path / "again" / "ckpt-1")
        assert restored_counter == 2
        assert (table != -1).all()
