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
