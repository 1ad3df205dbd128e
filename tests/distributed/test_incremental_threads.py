"""Incremental distributed saves (issue 16 item 4, docs/incremental.md), ranks as threads.

Each rank links the data files it wrote last time for its unchanged values; the merged index
points at them; every checkpoint stands alone; a failure on one rank commits nothing. The real
multi-process runs (gloo, TensorFlow reading the result) are in test_incremental_processes.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from thread_ranks import run_ranks  # noqa: E402

import trackpoint as tp  # noqa: E402
import trackpoint.distributed as tpd  # noqa: E402
from trackpoint.bundle.reader import BundleReader  # noqa: E402
from trackpoint.distributed.plan import TensorInfo, assign_writers  # noqa: E402
from trackpoint.errors import CheckpointError  # noqa: E402

INC = tp.CheckpointOptions(incremental=True)
MIB = 1 << 20
ROWS, COLS = 512, 1024  # the sharded table: 2 MiB of float32, 1 MiB per rank on 2 ranks


def full_table() -> np.ndarray:
    return np.random.default_rng(1).random((ROWS, COLS), dtype=np.float32)


def frozen_base() -> np.ndarray:
    return np.random.default_rng(2).random((256, 1024), dtype=np.float32)  # 1 MiB, replicated


class Rank:
    """One rank's objects: a replicated frozen base, its rows of a frozen table, an adapter."""

    def __init__(self, rank: int, world: int, collective: tpd.Collective) -> None:
        rows = ROWS // world
        self.start = rank * rows
        self.base = frozen_base()
        self.table = full_table()[self.start : self.start + rows].copy()
        self.adapter = np.zeros((64, 64), np.float32)  # 16 KiB, replicated, changes
        self.ckpt = tpd.DistributedCheckpoint(
            group=collective, timeout=20, base=self.base, adapter=self.adapter,
            table=tpd.Slice(self.table, (ROWS, COLS), (self.start, 0)),
        )  # fmt: skip


def data_files(prefix: Path) -> list[Path]:
    return sorted(prefix.parent.glob(prefix.name + ".data-*"))


def inodes(prefix: Path) -> dict[int, int]:
    return {os.stat(p).st_ino: os.path.getsize(p) for p in data_files(prefix)}


def new_bytes(prefix: Path, *earlier: Path) -> int:
    """Bytes of ``prefix``'s data files that no earlier checkpoint shares (newly written)."""
    seen = {ino for e in earlier for ino in inodes(e)}
    return sum(size for ino, size in inodes(prefix).items() if ino not in seen)


def read_all(prefix: Path) -> dict[str, np.ndarray]:
    with BundleReader(str(prefix)) as reader:
        return {key: reader.read(key) for key in reader.keys()}


def key(name: str) -> str:
    return f"{name}/.ATTRIBUTES/VARIABLE_VALUE"


def check_values(prefix: Path, adapter: float) -> None:
    got = read_all(prefix)
    np.testing.assert_array_equal(got[key("base")], frozen_base())
    np.testing.assert_array_equal(got[key("table")], full_table())
    np.testing.assert_array_equal(got[key("adapter")], np.full((64, 64), adapter, np.float32))


def test_second_save_links_each_ranks_unchanged_files_and_stands_alone(tmp_path: Path) -> None:
    def work(rank: int, collective: tpd.Collective) -> list[str]:
        r = Rank(rank, 2, collective)
        paths = []
        for step in (1, 2, 3):
            r.adapter[:] = step
            paths.append(r.ckpt.save(tmp_path / "ckpt", INC))
        return paths

    results = run_ranks(2, work)
    assert all(isinstance(r, list) for r in results), results
    first, second, third = (Path(p) for p in results[0])
    total = sum(os.path.getsize(p) for p in data_files(second))
    assert total > 3 * MIB  # base + table, complete in the second checkpoint
    # Only the small, changed values were written again: base and both ranks' table files
    # are the first checkpoint's inodes.
    assert new_bytes(second, first) < 256 << 10
    assert new_bytes(third, second) < 256 << 10
    linked = [p for p in data_files(second) if os.stat(p).st_nlink > 1]
    assert sum(os.path.getsize(p) for p in linked) >= 3 * MIB
    # Deleting the older checkpoints never breaks the newer ones.
    for prefix in (first, second):
        for path in [*data_files(prefix), prefix.with_name(prefix.name + ".index")]:
            path.unlink()
    check_values(third, 3.0)

    def restore(rank: int, collective: tpd.Collective) -> tuple[np.ndarray, ...]:
        r = Rank(rank, 2, collective)
        r.base[:], r.table[:] = 0, 0
        r.ckpt.restore(third).assert_consumed()
        return r.base, r.table, r.adapter

    for rank, (base, table, adapter) in enumerate(run_ranks(2, restore)):
        np.testing.assert_array_equal(base, frozen_base())
        rows = ROWS // 2
        np.testing.assert_array_equal(table, full_table()[rank * rows : (rank + 1) * rows])
        np.testing.assert_array_equal(adapter, np.full((64, 64), 3.0, np.float32))


def test_in_place_change_through_a_view_on_one_rank_is_written(tmp_path: Path) -> None:
    def work(rank: int, collective: tpd.Collective) -> list[str]:
        r = Rank(rank, 2, collective)
        r.ckpt.save(tmp_path / "ckpt", INC)
        first = r.ckpt.save(tmp_path / "ckpt", INC)  # unchanged: the table's files linked
        if rank == 1:
            view = r.table[10:12, :4]
            view += 1.0  # same object, same shape: only the bytes changed
        second = r.ckpt.save(tmp_path / "ckpt", INC)
        return [first, second]

    results = run_ranks(2, work)
    first, second = (Path(p) for p in results[0])
    expected = full_table()
    expected[ROWS // 2 + 10 : ROWS // 2 + 12, :4] += 1.0
    got = read_all(second)
    np.testing.assert_array_equal(got[key("table")], expected)
    np.testing.assert_array_equal(got[key("base")], frozen_base())
    # Rank 1's table file was written again; rank 0's and the base were linked.
    assert MIB <= new_bytes(second, first) < MIB + (256 << 10)


def test_a_failure_on_one_rank_commits_nothing_and_the_next_save_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trackpoint.saving import incremental

    real = incremental.link_bundle
    armed = threading.Event()

    def failing(*args: Any, **kwargs: Any) -> int:
        if armed.is_set() and threading.current_thread().name == "rank1":
            raise CheckpointError("link failed on purpose")
        return real(*args, **kwargs)

    monkeypatch.setattr(incremental, "link_bundle", failing)

    def work(rank: int, collective: tpd.Collective) -> list[Any]:
        r = Rank(rank, 2, collective)
        out: list[Any] = [r.ckpt.save(tmp_path / "ckpt", INC)]
        r.adapter[:] = 2
        if rank == 0:
            armed.set()
        collective.all_gather(None)  # armed for both ranks
        try:
            out.append(r.ckpt.save(tmp_path / "ckpt", INC))
        except CheckpointError as exc:
            out.append(exc)
        collective.all_gather(None)  # both ranks are past the failed save
        if rank == 0:
            armed.clear()
        collective.all_gather(None)
        r.adapter[:] = 3
        out.append(r.ckpt.save(tmp_path / "ckpt", INC))
        return out

    results = run_ranks(2, work)
    for rank, (_, failed, _) in enumerate(results):
        assert isinstance(failed, CheckpointError), (rank, failed)
        assert "link failed on purpose" in str(failed)
    assert not (tmp_path / "ckpt-2.index").exists()
    assert not [p for p in tmp_path.iterdir() if "_temp_" in p.name]
    assert tp.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-3")
    check_values(tmp_path / "ckpt-1", 0.0)
    check_values(tmp_path / "ckpt-3", 3.0)


def test_async_saves_under_a_manager_keep_only_the_latest_and_it_is_complete(
    tmp_path: Path,
) -> None:
    options = tp.CheckpointOptions(incremental=True, enable_async=True)

    def work(rank: int, collective: tpd.Collective) -> list[str]:
        r = Rank(rank, 2, collective)
        manager = tp.CheckpointManager(r.ckpt, tmp_path, max_to_keep=1)
        paths = []
        for step in (1, 2, 3):
            r.adapter[:] = step
            paths.append(manager.save(options=options))
            r.adapter[:] = -1  # after the call: must not reach the checkpoint
            r.ckpt.sync()
        r.ckpt.close()
        return paths

    results = run_ranks(2, work)
    assert all(isinstance(r, list) for r in results), results
    last = Path(results[0][-1])
    assert tp.latest_checkpoint(tmp_path) == str(last)
    assert [p.name for p in tmp_path.glob("*.index")] == [last.name + ".index"]
    check_values(last, 3.0)
    assert sum(os.path.getsize(p) for p in data_files(last) if os.stat(p).st_nlink > 1) == 0
    assert sum(os.path.getsize(p) for p in data_files(last)) > 3 * MIB


def test_after_a_restore_the_next_save_links_the_restored_files(tmp_path: Path) -> None:
    def save(rank: int, collective: tpd.Collective) -> str:
        return Rank(rank, 2, collective).ckpt.save(tmp_path / "ckpt", INC)

    run_ranks(2, save)
    first = tmp_path / "ckpt-1"

    def restore_and_save(rank: int, collective: tpd.Collective) -> str:
        r = Rank(rank, 2, collective)
        r.base[:], r.table[:] = 0, 0
        r.ckpt.restore(first).assert_consumed()
        r.adapter[:] = 5
        return r.ckpt.save(tmp_path / "ckpt", INC)

    results = run_ranks(2, restore_and_save)
    second = Path(results[0])
    assert second.name == "ckpt-2"
    check_values(second, 5.0)
    assert new_bytes(second, first) < 256 << 10


def test_claimed_values_go_back_to_the_rank_that_wrote_them() -> None:
    big, small = TensorInfo("a", "", "<f4", (4,), 400), TensorInfo("b", "", "<f4", (4,), 16)
    infos = [[big, small], [big, small]]
    assert assign_writers(infos) == [[0], [1]]  # balanced: largest first, to rank 0
    assert assign_writers(infos, preferred=[[], [0]]) == [[1], [0]]
    assert assign_writers(infos, preferred=[[0, 1], [0, 1]]) == [[0, 1], []]
    assert assign_writers(infos, preferred=[[7], []]) == [[0], [1]]  # stray index: ignored


def test_max_shard_size_policy_slices_are_reused_by_each_rank(tmp_path: Path) -> None:
    options = tp.CheckpointOptions(
        incremental=True, sharding_policy=tp.sharding.MaxShardSizePolicy(256 << 10)
    )

    def work(rank: int, collective: tpd.Collective) -> list[str]:
        r = Rank(rank, 2, collective)
        paths = []
        for step in (1, 2):
            r.adapter[:] = step
            paths.append(r.ckpt.save(tmp_path / "ckpt", options))
        return paths

    results = run_ranks(2, work)
    first, second = (Path(p) for p in results[0])
    sizes = [os.path.getsize(p) for p in data_files(second)]
    assert max(sizes) <= 256 << 10 and sum(sizes) > 3 * MIB  # the limit holds
    assert new_bytes(second, first) < 256 << 10  # every slice of base and table: linked
    check_values(second, 2.0)


def with_small(r: Rank, collective: tpd.Collective, small: np.ndarray) -> None:
    """Give rank ``r`` a checkpoint that also holds ``small`` (replicated)."""
    r.ckpt = tpd.DistributedCheckpoint(
        group=collective, timeout=20, base=r.base, adapter=r.adapter, small=small,
        table=tpd.Slice(r.table, (ROWS, COLS), (r.start, 0)),
    )  # fmt: skip


def test_async_save_copies_only_changed_values_and_later_mutation_does_not_matter(
    tmp_path: Path,
) -> None:
    """An async save decides at the call: unchanged values are neither copied nor read later.

    ``small`` (unchanged) shares its data file with ``adapter`` (changed), so it cannot be
    linked: it is written from the previous checkpoint's bytes, not from the mutated array.
    """
    options = tp.CheckpointOptions(incremental=True, enable_async=True)

    def work(rank: int, collective: tpd.Collective) -> dict[str, Any]:
        r = Rank(rank, 2, collective)
        small = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)  # 16 KiB, unchanged
        with_small(r, collective, small)
        staged: list[int] = []

        def progress(event: tp.ProgressEvent) -> None:
            if event.phase == "stage":
                staged.append(event.bytes_done)

        out: dict[str, Any] = {"paths": []}
        for step in (1, 2):
            r.adapter[:] = step
            run = tp.CheckpointOptions(
                incremental=True, enable_async=True, progress=progress
            ) if step == 2 else options  # fmt: skip
            out["paths"].append(r.ckpt.save(tmp_path / "ckpt", run))
            if step == 2:  # after the call: none of this may reach the checkpoint
                r.adapter[:] = -1
                small[:] = -1
                r.base[:] = -1
                r.table[:] = -1
            r.ckpt.sync()
        r.ckpt.close()
        out["staged"] = staged
        return out

    results = run_ranks(2, work)
    assert all(isinstance(r, dict) for r in results), results
    first, second = (Path(p) for p in results[0]["paths"])
    for rank, result in enumerate(results):
        # Only the changed values were copied: never the base (1 MiB) nor the table rows.
        assert result["staged"] and result["staged"][0] < 64 << 10, (rank, result["staged"])
    check_values(second, 2.0)
    got = read_all(second)
    np.testing.assert_array_equal(
        got[key("small")], np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    )
    assert new_bytes(second, first) < 256 << 10  # base and table linked, not rewritten


def test_async_save_fails_cleanly_when_an_uncopied_value_cannot_be_read_back(
    tmp_path: Path,
) -> None:
    """A value unchanged at the call but not linkable is read back from the previous
    checkpoint, or taken from memory if it still holds the call's value; if that checkpoint
    was replaced meanwhile and the value changed, the save fails, committing nothing."""
    options = tp.CheckpointOptions(incremental=True, enable_async=True)
    smalls: dict[int, np.ndarray] = {}

    def work(rank: int, collective: tpd.Collective) -> list[Any]:
        r = Rank(rank, 2, collective)
        small = smalls[rank] = np.ones((64, 64), np.float32)
        with_small(r, collective, small)
        out: list[Any] = [r.ckpt.save(tmp_path / "ckpt", options)]
        r.ckpt.sync()
        r.adapter[:] = 2
        r.ckpt.save(tmp_path / "ckpt", options)
        small[:] = -1
        try:
            r.ckpt.sync()
            out.append(None)
        except CheckpointError as exc:
            out.append(exc)
        r.adapter[:], small[:] = 3, 7
        out.append(r.ckpt.save(tmp_path / "ckpt", INC))  # after the failure: complete
        r.ckpt.close()
        return out

    # Replace ckpt-1's index between the call and the background plan: the writer thread
    # plans only after the call returns, so remove the whole checkpoint from a hook.
    from trackpoint.distributed import saver as dsaver

    real = dsaver._SaveRun._shard
    gone = threading.Event()

    def shard(self: Any, tensors: Any) -> Any:
        if self.detached:
            smalls[self.rank][:] = -1  # changed after the call, before this rank plans
        if self.detached and not gone.is_set():
            with gone_lock:
                if not gone.is_set():
                    for path in tmp_path.glob("ckpt-1.*"):
                        path.unlink()
                    gone.set()
        return real(self, tensors)

    gone_lock = threading.Lock()
    dsaver._SaveRun._shard = shard  # type: ignore[method-assign]
    try:
        results = run_ranks(2, work)
    finally:
        dsaver._SaveRun._shard = real  # type: ignore[method-assign]
    assert gone.is_set()
    for rank, (_, failed, _) in enumerate(results):
        assert isinstance(failed, CheckpointError), (rank, failed)
        assert "not copied" in str(failed), failed
    assert not (tmp_path / "ckpt-2.index").exists()
    third = Path(results[0][2])
    check_values(third, 3.0)
    np.testing.assert_array_equal(read_all(third)[key("small")], np.full((64, 64), 7.0))


def flip_a_byte_keeping_mtime(path: Path) -> None:
    stat = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(stat.st_size // 2)
        byte = f.read(1)
        f.seek(stat.st_size // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_damaged_data_files_are_not_linked_forward_by_any_rank(tmp_path: Path, mode: str) -> None:
    """Issue 27 finding 2, thread ranks: the previous checkpoint's large data files (the base
    and both ranks' table rows) damaged in place, size and mtime kept. Each rank writes its
    values from memory instead of linking them; after rotation the newest checkpoint is whole.
    """
    options = tp.CheckpointOptions(incremental=True, enable_async=mode == "async")

    def work(rank: int, collective: tpd.Collective) -> list[str]:
        r = Rank(rank, 2, collective)
        manager = tp.CheckpointManager(r.ckpt, tmp_path, max_to_keep=2)
        paths = [manager.save(options=options)]
        r.ckpt.sync()
        collective.all_gather(None)  # both ranks are past the first save
        if rank == 0:
            for path in data_files(Path(paths[0])):
                if os.path.getsize(path) >= MIB:
                    flip_a_byte_keeping_mtime(path)
        collective.all_gather(None)  # damaged before either rank plans the next save
        for step in (2, 3, 4):
            r.adapter[:] = step
            paths.append(manager.save(options=options))
            r.ckpt.sync()
        r.ckpt.close()
        return paths

    results = run_ranks(2, work)
    assert all(isinstance(r, list) for r in results), results
    last = Path(results[0][-1])
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["ckpt-3.index", "ckpt-4.index"]
    check_values(tmp_path / "ckpt-3", 3.0)
    check_values(last, 4.0)
    assert new_bytes(last, tmp_path / "ckpt-3") < 256 << 10  # good files are linked again
