"""Issue 27 findings 11 and 12 over thread ranks (``tpd.ThreadGroup``; fast).

11. Rebinding an attribute of a ``DistributedCheckpoint`` (``ckpt.params = new_params``, the JAX
    pattern) changes what the next save writes, exactly as on a ``tp.Checkpoint``.
12. A value several ranks hold whole (a replica: written once) that differs between them is
    refused, naming its key, the ranks and small values, and nothing is committed; a
    per-process value kept as each rank's slice of a tensor sharded by rank is saved per rank
    and restored to its own rank.

The same two findings over 2 ``jax.distributed`` processes: test_jax_processes.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from thread_ranks import run_ranks

import trackpoint as tp
import trackpoint.distributed as tpd
from trackpoint.errors import InvalidArgumentError

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


class Loader(tp.PythonState):
    """A data loader's position: per-process state in a PythonState."""

    def __init__(self, pos: int) -> None:
        self.pos = pos

    def serialize(self) -> bytes:
        return json.dumps({"pos": self.pos}).encode()

    def deserialize(self, data: bytes) -> None:
        self.pos = json.loads(data)["pos"]


def _dckpt(collective: tpd.Collective, **children: Any) -> tpd.DistributedCheckpoint:
    return tpd.DistributedCheckpoint(group=collective, timeout=20, **children)


def _raise_any(results: list[Any]) -> list[Any]:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


# -- 11: rebinding -------------------------------------------------------------------------------


def test_rebinding_attributes_between_saves_saves_the_new_values(tmp_path: Path) -> None:
    def work(rank: int, collective: tpd.Collective) -> list[str]:
        ckpt = _dckpt(collective, params={"w": np.zeros(3)}, step=tp.Variable(0))
        paths = [ckpt.save(tmp_path / "ckpt")]
        for step in (1, 2):
            ckpt.params = {"w": np.full(3, float(step))}  # rebinding, as a JAX step does
            ckpt.extra = np.full(2, 10.0 * step)  # a new child, added on the wrapper
            paths.append(ckpt.save(tmp_path / "ckpt"))
        assert ckpt.params["w"][0] == 2.0 and ckpt.checkpoint.params is ckpt.params
        del ckpt.extra  # dropped from the next save, as on a tp.Checkpoint
        paths.append(ckpt.save(tmp_path / "ckpt"))
        ckpt.close()
        return paths

    results = _raise_any(run_ranks(2, work))
    assert results[0] == results[1]
    first, second, third, fourth = (Path(p) for p in results[0])
    assert tp.load_variable(first, "params/w" + VALUE).tolist() == [0.0] * 3
    assert tp.load_variable(second, "params/w" + VALUE).tolist() == [1.0] * 3
    assert tp.load_variable(third, "params/w" + VALUE).tolist() == [2.0] * 3
    assert tp.load_variable(third, "extra" + VALUE).tolist() == [20.0] * 2
    assert "extra" + VALUE not in dict(tp.list_variables(fourth))
    # The same values a tp.Checkpoint rebinding the same way writes.
    plain = tp.Checkpoint(params={"w": np.zeros(3)})
    plain.params = {"w": np.full(3, 2.0)}
    alone = plain.write(tmp_path / "alone")
    assert tp.load_variable(alone, "params/w" + VALUE).tolist() == [2.0] * 3


def test_rebinding_before_an_async_save_and_after_the_call(tmp_path: Path) -> None:
    def work(rank: int, collective: tpd.Collective) -> str:
        ckpt = _dckpt(collective, params={"w": np.zeros(2)})
        ckpt.params = {"w": np.ones(2)}
        path = ckpt.save(tmp_path / "ckpt", tp.CheckpointOptions(enable_async=True))
        ckpt.params = {"w": np.full(2, 5.0)}  # after the call: not in this checkpoint
        ckpt.sync()
        ckpt.close()
        return path

    (path, _) = _raise_any(run_ranks(2, work))
    assert tp.load_variable(path, "params/w" + VALUE).tolist() == [1.0, 1.0]


def test_the_wrappers_own_names_stay_its_own() -> None:
    ckpt = tpd.DistributedCheckpoint(x=np.zeros(1))
    assert ckpt.rank == 0 and ckpt.world_size == 1 and ckpt.checkpoint.x is ckpt.x
    with pytest.raises(AttributeError):
        ckpt.rank = 3  # a read-only property of the wrapper, not a child
    with pytest.raises(AttributeError, match="missing"):
        _ = ckpt.missing


# -- 12: replicas that differ between ranks --------------------------------------------------


def _save_differing(
    tmp_path: Path, make: Any, *, incremental: bool = False, enable_async: bool = False
) -> list[Any]:
    options = tp.CheckpointOptions(incremental=incremental, enable_async=enable_async)

    def work(rank: int, collective: tpd.Collective) -> Any:
        ckpt = _dckpt(collective, **make(rank))
        try:
            ckpt.save(tmp_path / "ckpt", options)
            ckpt.sync()
        finally:
            ckpt.close()

    return run_ranks(2, work)


@pytest.mark.parametrize(
    ("make", "key", "shown"),
    [
        (
            lambda r: {"loader": Loader(100 + r)},
            "loader/.ATTRIBUTES/py_state",
            ["rank 0: '{\"pos\": 100}'", "rank 1: '{\"pos\": 101}'"],
        ),
        (
            lambda r: {"state": {"pos": 100 + r, "w": np.zeros(2)}},
            "state/.ATTRIBUTES/py_state",
            ['"pos":100', '"pos":101'],
        ),
        (
            lambda r: {"w": np.arange(3.0) + r},
            "w" + VALUE,
            ["rank 0: [0.0, 1.0, 2.0]", "rank 1: [1.0, 2.0, 3.0]"],
        ),
        (lambda r: {"w": np.full((64, 64), float(r == 1))}, "w" + VALUE, ["rank 0", "rank 1"]),
    ],
    ids=["python-state", "python-int-in-dict", "small-array", "large-array"],
)
def test_a_replica_differing_between_ranks_is_refused_naming_it(
    tmp_path: Path, make: Any, key: str, shown: list[str]
) -> None:
    results = _save_differing(tmp_path, make)
    for result in results:
        assert isinstance(result, InvalidArgumentError), result
        message = str(result)
        assert "differ between them" in message and repr(key) in message, message
        for text in shown:
            assert text in message, message
    assert tp.latest_checkpoint(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing committed, nothing left


@pytest.mark.parametrize(
    ("incremental", "enable_async"), [(True, False), (True, True), (False, True)]
)
def test_differing_replicas_are_refused_by_incremental_and_async_saves(
    tmp_path: Path, incremental: bool, enable_async: bool
) -> None:
    results = _save_differing(
        tmp_path,
        lambda r: {"w": np.arange(3.0) + r, "zz_agreed": np.ones(4)},
        incremental=incremental,
        enable_async=enable_async,
    )
    for result in results:
        assert isinstance(result, InvalidArgumentError), result
        assert repr("w" + VALUE) in str(result) and "zz_agreed" not in str(result)
    assert tp.latest_checkpoint(tmp_path) is None


def test_an_async_incremental_save_compares_the_values_at_the_call(tmp_path: Path) -> None:
    # The second save copies nothing unchanged; a rank changing its replica after the call
    # must not make the (equal at the call) replicas look different, nor the checkpoint wrong.
    options = tp.CheckpointOptions(incremental=True, enable_async=True)

    def work(rank: int, collective: tpd.Collective) -> str:
        shared = np.ones(1000)
        ckpt = _dckpt(collective, shared=shared, step=tp.Variable(0))
        ckpt.save(tmp_path / "ckpt", options)
        ckpt.step.assign(1)
        path = ckpt.save(tmp_path / "ckpt", options)
        shared[:] = rank + 7  # after the call, differently on each rank
        ckpt.sync()
        ckpt.close()
        return path

    (path, _) = _raise_any(run_ranks(2, work))
    assert tp.load_variable(path, "shared" + VALUE).tolist() == [1.0] * 1000


def test_equal_replicas_save_and_a_refused_save_leaves_the_checkpoint_usable(
    tmp_path: Path,
) -> None:
    def work(rank: int, collective: tpd.Collective) -> str:
        loader = Loader(100 + rank)
        ckpt = _dckpt(collective, loader=loader, w=np.ones(3))
        with pytest.raises(InvalidArgumentError, match="differ between them"):
            ckpt.save(tmp_path / "ckpt")
        assert tp.latest_checkpoint(tmp_path) is None
        loader.pos = 7  # now the same everywhere
        path = ckpt.save(tmp_path / "ckpt")
        ckpt.close()
        return path

    first, second = _raise_any(run_ranks(2, work))
    assert first == second == tp.latest_checkpoint(tmp_path)
    assert json.loads(tp.load_variable(first, "loader/.ATTRIBUTES/py_state").item()) == {"pos": 7}


def test_per_process_values_as_slices_by_rank_are_saved_and_restored_per_rank(
    tmp_path: Path,
) -> None:
    # The documented way to keep per-process state: each rank's part of a tensor sharded by
    # rank (a data loader's position, an RNG state's words).
    def save(rank: int, collective: tpd.Collective) -> str:
        world = collective.world_size
        pos = np.array([100 + rank], dtype=np.int64)
        ckpt = _dckpt(collective, pos=tpd.Slice(pos, (world,), (rank,)), w=np.ones(2))
        path = ckpt.save(tmp_path / "ckpt")
        ckpt.close()
        return path

    (path, _) = _raise_any(run_ranks(2, save))
    assert tp.load_variable(path, "pos" + VALUE).tolist() == [100, 101]

    def restore(rank: int, collective: tpd.Collective) -> int:
        pos = np.zeros(1, dtype=np.int64)
        _dckpt(collective, pos=tpd.Slice(pos, (2,), (rank,)), w=np.zeros(2)).restore(
            path
        ).assert_consumed()
        return int(pos[0])

    assert _raise_any(run_ranks(2, restore)) == [100, 101]


def test_per_process_array_state_as_a_row_by_rank_restores_in_place(tmp_path: Path) -> None:
    # docs/distributed.md: an RNG's state (here numpy bytes) as a view with a leading axis.
    def state_of(rank: int) -> np.ndarray:
        return np.random.default_rng(rank).integers(0, 256, 16, dtype=np.uint8)

    def save(rank: int, collective: tpd.Collective) -> str:
        state = state_of(rank)
        ckpt = _dckpt(collective, rng=tpd.Slice(state[None], (2, 16), (rank, 0)))
        path = ckpt.save(tmp_path / "ckpt")
        ckpt.close()
        return path

    (path, _) = _raise_any(run_ranks(2, save))
    stored = tp.load_variable(path, "rng" + VALUE)
    np.testing.assert_array_equal(stored, np.stack([state_of(0), state_of(1)]))

    def restore(rank: int, collective: tpd.Collective) -> bool:
        state = np.zeros(16, np.uint8)
        _dckpt(collective, rng=tpd.Slice(state[None], (2, 16), (rank, 0))).restore(
            path
        ).assert_consumed()
        return bool(np.array_equal(state, state_of(rank)))

    assert _raise_any(run_ranks(2, restore)) == [True, True]
