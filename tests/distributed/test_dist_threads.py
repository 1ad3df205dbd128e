"""The distributed protocol in one process: ranks are threads of a ``ThreadGroup``.

Fast checks of what the process tests cannot afford to repeat: the save plan's validation
errors, byte balancing of replicated values, flat ranges cut into boxes, numpy ``Slice`` /
``FlatSlice`` values resharded, errors raised on every rank, a rank that never joins, coalesced
reads, ``CheckpointManager`` on every rank, the figures of a save.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from thread_ranks import run_ranks  # noqa: E402

import trackpoint as tp  # noqa: E402
import trackpoint.distributed as tpd  # noqa: E402
from trackpoint import metrics  # noqa: E402
from trackpoint.distributed.layout import flat_range_boxes  # noqa: E402
from trackpoint.distributed.plan import TensorInfo, assign_writers  # noqa: E402
from trackpoint.distributed.read_plan import ByteRange, coalesce  # noqa: E402
from trackpoint.errors import CheckpointError, InvalidArgumentError  # noqa: E402
from trackpoint.storage import LocalStorage, RangeReader  # noqa: E402

FULL = np.arange(60, dtype=np.float32).reshape(10, 6)


def rows(world: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(FULL.shape[0], world)
    return rank * base + min(rank, extra), base + (rank < extra)


def sharded_values(world: int, rank: int, *, fill: float | None = None) -> dict[str, Any]:
    start, count = rows(world, rank)
    flat_start, flat_stop = FULL.size * rank // world, FULL.size * (rank + 1) // world
    table = FULL[start : start + count].copy()
    flat = FULL.reshape(-1)[flat_start:flat_stop].copy()
    shared = np.arange(5, dtype=np.int64)
    if fill is not None:
        table[:], flat[:], shared[:] = fill, fill, 0
    return {
        "table": tpd.Slice(table, FULL.shape, (start, 0)),
        "flat": tpd.FlatSlice(flat, FULL.shape, flat_start),
        "shared": shared,
        "_locals": (table, flat, shared),
    }


def checkpoint(values: dict[str, Any], collective: tpd.Collective) -> tpd.DistributedCheckpoint:
    objects = {k: v for k, v in values.items() if not k.startswith("_")}
    return tpd.DistributedCheckpoint(group=collective, timeout=20, **objects)


def test_save_on_2_threads_restore_on_3_with_other_slices(tmp_path: Path) -> None:
    def save(rank: int, collective: tpd.Collective) -> str:
        return checkpoint(sharded_values(2, rank), collective).save(tmp_path / "ckpt")

    assert run_ranks(2, save) == [str(tmp_path / "ckpt-1")] * 2
    reader = tp.load_checkpoint(tmp_path / "ckpt-1")
    np.testing.assert_array_equal(reader.get_tensor("table/.ATTRIBUTES/VARIABLE_VALUE"), FULL)
    np.testing.assert_array_equal(reader.get_tensor("flat/.ATTRIBUTES/VARIABLE_VALUE"), FULL)

    def restore(rank: int, collective: tpd.Collective) -> tuple[Any, ...]:
        values = sharded_values(3, rank, fill=-1)
        checkpoint(values, collective).restore(tmp_path).assert_consumed()
        return values["_locals"]

    for rank, (table, flat, shared) in enumerate(run_ranks(3, restore)):
        start, count = rows(3, rank)
        np.testing.assert_array_equal(table, FULL[start : start + count])
        flat_start = FULL.size * rank // 3
        np.testing.assert_array_equal(flat, FULL.reshape(-1)[flat_start : flat_start + flat.size])
        np.testing.assert_array_equal(shared, np.arange(5))


def test_a_rank_failing_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    def policy_for(rank: int) -> Callable[..., Any]:
        def policy(tensors: Any) -> Any:
            if rank == 1:
                raise OSError("disk on fire")
            return tp.sharding.ShardByTaskPolicy()(tensors)
        return policy

    def save(rank: int, collective: tpd.Collective) -> str:
        ckpt = checkpoint(sharded_values(3, rank), collective)
        ckpt.save(tmp_path / "ckpt")
        options = tp.CheckpointOptions(sharding_policy=policy_for(rank))
        return ckpt.save(tmp_path / "ckpt", options)

    results = run_ranks(3, save)
    assert isinstance(results[1], OSError)
    for rank in (0, 2):
        assert isinstance(results[rank], CheckpointError), results[rank]
        assert "rank 1: OSError: disk on fire" in str(results[rank])
    assert tp.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-1")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ckpt-1")) == [
        "checkpoint"
    ]


def test_a_rank_leaving_the_group_fails_the_save_on_the_others(tmp_path: Path) -> None:
    group = tpd.ThreadGroup(2, timeout=20)
    errors: list[BaseException] = []

    def rank0() -> None:
        try:
            checkpoint({"x": np.zeros(3)}, group.collective(0)).write(tmp_path / "ckpt")
        except BaseException as exc:  # noqa: BLE001  (checked below)
            errors.append(exc)

    thread = threading.Thread(target=rank0)
    thread.start()
    group.abort()  # rank 1 "dies" instead of saving
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], tpd.CollectiveError), errors
    assert f"Saving checkpoint {tmp_path / 'ckpt'} failed, nothing was committed" in str(errors[0])
    assert not (tmp_path / "ckpt.index").exists()
    assert not [p for p in tmp_path.iterdir() if "_temp_" in p.name]


def test_a_rank_alive_but_never_joining_fails_the_save_after_the_timeout(tmp_path: Path) -> None:
    group = tpd.ThreadGroup(2, timeout=3)
    outcome: list[Any] = []

    def rank0() -> None:
        started = time.monotonic()
        try:
            checkpoint({"x": np.zeros(3)}, group.collective(0)).write(tmp_path / "ckpt")
        except BaseException as exc:  # noqa: BLE001  (checked below)
            outcome.append(exc)
        outcome.append(time.monotonic() - started)

    thread = threading.Thread(target=rank0)
    thread.start()  # rank 1 stays alive (this thread) but never calls write
    thread.join(30)
    assert not thread.is_alive()
    error, waited = outcome
    assert isinstance(error, tpd.CollectiveError), error
    assert "did not take part within 3 s" in str(error)
    assert f"Saving checkpoint {tmp_path / 'ckpt'} failed, nothing was committed" in str(error)
    assert waited >= 2.5
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no temporary folder


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda r: {"t": tpd.Slice(np.zeros((6, 6), np.float32), (10, 6), (r * 4, 0))},
         "overlap"),
        (lambda r: {"t": tpd.Slice(np.zeros((4, 6), np.float32), (10, 6), (r * 4, 0))},
         "cover 48 of the 60"),
        (lambda r: {"t": np.zeros(3 + r, np.float32)}, "ranks disagree"),
        (lambda r: {"t": tpd.Slice(np.zeros((5, 6), np.float32), (10, 6), (5, 0))} if r
         else {"t": np.zeros((10, 6), np.float32)}, "whole tensor on some ranks"),
        (lambda r: {f"t{r}": np.zeros(3)}, "not in the object graph of rank 0"),
    ],
    ids=["overlap", "hole", "replicas-differ", "whole-and-sliced", "rank-only-object"],
)
def test_inconsistent_ranks_fail_before_anything_is_written(
    tmp_path: Path, make: Callable[[int], dict[str, Any]], message: str
) -> None:
    results = run_ranks(2, lambda r, c: checkpoint(make(r), c).save(tmp_path / "ckpt"))
    for result in results:
        assert isinstance(result, InvalidArgumentError), result
        assert message in str(result)
    assert list(tmp_path.iterdir()) == []


def test_ranks_saving_different_prefixes_is_an_error(tmp_path: Path) -> None:
    results = run_ranks(
        2, lambda r, c: checkpoint({"x": np.zeros(2)}, c).write(tmp_path / f"ckpt{r}")
    )
    for result in results:
        assert isinstance(result, InvalidArgumentError) and "same prefix" in str(result)


def test_replicated_values_are_written_once_balancing_bytes() -> None:
    sizes = [400, 300, 200, 100]
    infos = [
        [TensorInfo(f"v{i}", "", "<f4", (n // 4,), n) for i, n in enumerate(sizes)]
        for _ in range(4)
    ]
    writes = assign_writers(infos)
    assert sorted(i for w in writes for i in w) == [0, 1, 2, 3]  # each value once
    assert all(len(w) == 1 for w in writes)  # one per rank: the bytes are balanced


def test_slices_are_written_by_their_owners() -> None:
    def info(rank: int) -> TensorInfo:
        return TensorInfo("t", f"4 2 {rank * 2},2:-", "<f4", (2, 2), 16)

    assert assign_writers([[info(0)], [info(1)]]) == [[0], [0]]


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 3)])
def test_flat_ranges_become_boxes_in_flat_order(shape: tuple[int, ...]) -> None:
    full = np.arange(math.prod(shape)).reshape(shape)
    for start in range(full.size):
        for stop in range(start + 1, full.size + 1):
            boxes = flat_range_boxes(shape, start, stop)
            assert len(boxes) <= 2 * len(shape) - 1
            pieces = [
                full[tuple(slice(o, o + n) for o, n in zip(b.offsets, b.shape))].reshape(-1)
                for b in boxes
            ]
            np.testing.assert_array_equal(np.concatenate(pieces), np.arange(start, stop))


def test_coalesce_merges_close_ranges_per_file() -> None:
    ranges = [ByteRange("a", 0, 10), ByteRange("a", 12, 8), ByteRange("a", 100, 5),
              ByteRange("b", 0, 4)]
    assert coalesce(ranges, max_gap=4, max_size=1000) == {"a": [(0, 20), (100, 105)],
                                                        "b": [(0, 4)]}
    assert coalesce(ranges, max_gap=100, max_size=1000) == {"a": [(0, 105)], "b": [(0, 4)]}
    assert coalesce(ranges, max_gap=100, max_size=15) == {"a": [(0, 10), (12, 20), (100, 105)],
                                                        "b": [(0, 4)]}


class CountingStorage(LocalStorage):
    """A local disk that counts the range reads of data files."""

    def __init__(self) -> None:
        super().__init__(fsync=False)
        self.data_reads = 0
        self.lock = threading.Lock()

    def open_range_reader(self, path: str) -> RangeReader:
        reader = super().open_range_reader(path)
        if ".data-" not in path:
            return reader
        storage = self

        class Counted(RangeReader):
            size = reader.size

            def read(self, offset: int, length: int) -> memoryview:
                with storage.lock:
                    storage.data_reads += 1
                return reader.read(offset, length)

            def close(self) -> None:
                reader.close()

        return Counted()


def test_restore_with_coalesced_reads_makes_one_request_per_file(tmp_path: Path) -> None:
    many = {f"v{i:02d}": np.full(50, i, np.float32) for i in range(20)}

    def save(rank: int, collective: tpd.Collective) -> str:
        return checkpoint({**sharded_values(2, rank), **many}, collective).save(tmp_path / "c")

    run_ranks(2, save)
    storage = CountingStorage()
    values = {**sharded_values(1, 0, fill=-1),
              **{k: np.zeros_like(v) for k, v in many.items()}}
    ckpt = tpd.DistributedCheckpoint(coalesce_reads=True, **{
        k: v for k, v in values.items() if not k.startswith("_")})
    ckpt.restore(tmp_path, tp.CheckpointOptions(storage=storage)).assert_consumed()
    np.testing.assert_array_equal(values["_locals"][0], FULL)
    for name, value in many.items():
        np.testing.assert_array_equal(values[name], value)
    assert storage.data_reads == 2  # 2 data files, one merged request each


def test_checkpoint_manager_on_every_rank_agrees_and_only_the_coordinator_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trackpoint.management.manager as management

    rank_of: dict[int, int] = {}  # id(manager) -> rank
    calls: list[tuple[Any, ...]] = []

    def spy(name: str) -> None:
        real = getattr(tp.CheckpointManager, name)

        def wrapped(self: tp.CheckpointManager, *args: Any) -> Any:
            calls.append((rank_of[id(self)], name))
            return real(self, *args)
        monkeypatch.setattr(tp.CheckpointManager, name, wrapped)

    spy("_record_state")
    spy("_sweep")
    real_remove = management.remove_checkpoint

    def remove(path: str, **kwargs: Any) -> None:
        newest = tp.latest_checkpoint(tmp_path)
        calls.append(("remove", path, Path(f"{newest}.index").exists()))
        real_remove(path, **kwargs)

    monkeypatch.setattr(management, "remove_checkpoint", remove)
    initialized = []

    def save(rank: int, collective: tpd.Collective) -> tuple[Any, ...]:
        ckpt = checkpoint(sharded_values(2, rank), collective)
        manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=2,
                                       init_fn=lambda: initialized.append(rank))
        rank_of[id(manager)] = rank
        first = manager.restore_or_initialize()
        paths = [manager.save(), manager.save(options=tp.CheckpointOptions(enable_async=True))]
        manager.sync()
        paths.append(manager.save())
        return first, paths, manager.latest_checkpoint, manager.checkpoints

    results = run_ranks(2, save)
    expected = [str(tmp_path / f"ckpt-{n}") for n in (1, 2, 3)]
    assert results[0] == results[1] == (None, expected, expected[2], expected[1:]), results
    assert sorted(initialized) == [0, 1]
    # The state file and the sweep: on the coordinator only, once per save; ckpt-1 is
    # deleted once, after ckpt-3 is committed and the state file no longer names it.
    assert [c for c in calls if c[0] != "remove"] == [(0, "_sweep"), (0, "_record_state")] * 3
    assert [c for c in calls if c[0] == "remove"] == [("remove", expected[0], True)]
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["ckpt-2.index", "ckpt-3.index"]
    assert tp.latest_checkpoint(tmp_path) == expected[2]

    def restore(rank: int, collective: tpd.Collective) -> tuple[Any, ...]:
        values = sharded_values(2, rank, fill=-1)
        manager = tp.CheckpointManager(checkpoint(values, collective), tmp_path, max_to_keep=2)
        return manager.restore_or_initialize(), manager.checkpoints, values["_locals"]

    for rank, (restored, managed, (table, _, shared)) in enumerate(run_ranks(2, restore)):
        assert restored == expected[2] and managed == expected[1:]
        start, count = rows(2, rank)
        np.testing.assert_array_equal(table, FULL[start : start + count])
        np.testing.assert_array_equal(shared, np.arange(5))


@pytest.mark.parametrize("enable_async", [False, True], ids=["sync", "async"])
def test_a_save_records_the_figures_of_one_checkpoint_and_each_ranks_durations(
    tmp_path: Path, enable_async: bool
) -> None:
    metrics.reset()
    events: dict[int, list[tp.saving.ProgressEvent]] = {0: [], 1: []}

    def save(rank: int, collective: tpd.Collective) -> str:
        ckpt = checkpoint(sharded_values(2, rank), collective)
        options = tp.CheckpointOptions(progress=events[rank].append, enable_async=enable_async)
        path = ckpt.write(tmp_path / "ckpt", options)
        ckpt.sync()
        return path

    try:
        assert run_ranks(2, save) == [str(tmp_path / "ckpt")] * 2
        figures = metrics.snapshot()
    finally:
        metrics.reset()
    data = [f.stat().st_size for f in sorted(tmp_path.glob("ckpt.data-*"))]
    size = sum(data) + (tmp_path / "ckpt.index").stat().st_size
    mode = "async" if enable_async else "sync"
    commits = []
    for rank in (0, 1):
        last = events[rank][-1]
        assert last.phase == "commit" and last.num_shards == len(data) == 2
        stats = last.stats
        assert isinstance(stats, metrics.WriteStats) and stats.mode == mode
        assert stats.shard_bytes == tuple(data) and stats.checkpoint_bytes == size
        assert stats.blocking_seconds > 0
        commits.append(last)
        writes = [e for e in events[rank] if e.phase == "write"]
        assert [e.shard_id for e in writes] == [rank]  # one shard per rank, numbered by rank
    assert commits[0].bytes_total == commits[1].bytes_total > 0
    # The checkpoint once (the coordinator), the durations of both ranks (one registry here).
    assert figures[metrics.CHECKPOINT_SIZE][()]["count"] == 1
    assert figures[metrics.CHECKPOINT_SIZE][()]["sum"] == size
    assert figures[metrics.SHARDS_WRITTEN][()] == 2
    assert figures[metrics.BYTES_WRITTEN][()] == size
    blocking = (("mode", mode), ("phase", "blocking"))
    assert figures[metrics.WRITE_DURATION][blocking]["count"] == 2
    if enable_async:
        background = (("mode", "async"), ("phase", "background"))
        assert figures[metrics.WRITE_DURATION][background]["count"] == 2
