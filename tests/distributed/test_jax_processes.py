"""Multi-process JAX: ``jax.distributed`` jobs on loopback (see jax_dist_worker.py).

A 4-process job (2 CPU devices each) saves global arrays of several shardings and a sharded
Flax NNX model with its optax optimizer through ``tp.CheckpointManager`` on a
``DistributedCheckpoint`` (the ``jax.distributed`` backend, chosen automatically), and restores
them into other shardings; 2- and 1-process jobs restore the 4-process checkpoint into their own
shardings. A 4-process job in which one process is killed mid-save leaves the previous
checkpoint the latest. The JAX collective itself is tested over threads with an in-memory
key-value store standing in for the coordination service.
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")

import jobs  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.distributed.jax_collective import JaxCollective  # noqa: E402
from trackpoint.errors import CollectiveError  # noqa: E402

WORKER = Path(__file__).with_name("jax_dist_worker.py")
REPO = Path(__file__).resolve().parents[2]
KILL_PROCESS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(scenario: str, count: int, workdir: Path) -> list[jobs.Process]:
    """Run ``count`` worker processes of one job (timeouts: jobs.py); each with its result."""
    port = str(free_port())
    return jobs.run_job(
        [[sys.executable, str(WORKER), scenario, str(workdir), port, str(count), str(i)]
         for i in range(count)],
        workdir,
        results=[workdir / f"result-{scenario}-{i}.json" for i in range(count)],
    )  # fmt: skip


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    workdir = tmp_path_factory.mktemp("jax-saved-by-4")
    results = launch("save", 4, workdir)
    jobs.check(results)
    return workdir, [p.result for p in results]


@pytest.mark.slow  # the 4-process fixture: ~75 s on a loaded 2-core machine
def test_4_processes_save_global_arrays_and_an_nnx_model_into_one_checkpoint(
    saved_by_4: tuple[Path, list[Any]],
) -> None:
    workdir, results = saved_by_4
    directory = workdir / "ckpts"
    for res in results:
        assert res["collective"] == "JaxCollective"  # chosen without naming it
        assert res["latest"] == str(directory / "ckpt-2")
        assert res["checkpoints"] == [str(directory / "ckpt-1"), str(directory / "ckpt-2")]
        # A plain Checkpoint of a global array is refused (it would hold one process's part).
        assert "spans several processes" in res["alone"]
    assert tp.latest_checkpoint(directory) == str(directory / "ckpt-2")
    names = sorted(p.name for p in directory.iterdir())
    assert len([n for n in names if n.startswith("ckpt-2.data-")]) == 4  # one per process
    assert not [n for n in names if "_temp" in n]
    expected = dict(np.load(workdir / "expected.npz"))
    reader = tp.load_checkpoint(directory / "ckpt-2")
    for name, key in [
        ("['arrays']['rows']", "arrays/rows/.ATTRIBUTES/VARIABLE_VALUE"),
        ("['arrays']['grid']", "arrays/grid/.ATTRIBUTES/VARIABLE_VALUE"),
        ("['arrays']['block']", "arrays/block/.ATTRIBUTES/VARIABLE_VALUE"),
        ("['arrays']['whole']", "arrays/whole/.ATTRIBUTES/VARIABLE_VALUE"),
        ("['model']['l1']['kernel'].value", "model/l1/kernel/value/.ATTRIBUTES/VARIABLE_VALUE"),
        (
            "['opt']['opt_state'][0]['mu']['l1']['kernel'].value",
            "opt/opt_state/0/mu/l1/kernel/value/.ATTRIBUTES/VARIABLE_VALUE",
        ),
    ]:
        np.testing.assert_array_equal(reader.get_tensor(key), expected[name], err_msg=key)
    # Sharded leaves are stored as slices (one per distinct shard); replicated ones once.
    from trackpoint.distributed.read_plan import IndexView
    from trackpoint.storage import LocalStorage

    index = IndexView.load(str(directory / "ckpt-2"), LocalStorage())
    assert len(index.ranges("arrays/rows/.ATTRIBUTES/VARIABLE_VALUE")) == 8  # 8 devices
    assert len(index.ranges("arrays/grid/.ATTRIBUTES/VARIABLE_VALUE")) == 8  # 4 x 2 grid
    assert len(index.ranges("arrays/block/.ATTRIBUTES/VARIABLE_VALUE")) == 2  # across processes
    assert len(index.ranges("arrays/whole/.ATTRIBUTES/VARIABLE_VALUE")) == 1


@pytest.mark.slow  # the 4-process fixture
def test_4_processes_restore_into_other_shardings(saved_by_4: tuple[Path, list[Any]]) -> None:
    _, results = saved_by_4
    for res in results:
        restored = res["restore"]
        assert restored["checked"] == 21  # every leaf compared shard by shard
        assert not restored["fully_addressable"] and restored["rows_local_shards"] == 2


@pytest.mark.slow  # the 4-process fixture, then 1-2 processes
@pytest.mark.parametrize("count", [2, 1])
def test_checkpoint_of_4_processes_restores_on_fewer(
    saved_by_4: tuple[Path, list[Any]], count: int
) -> None:
    workdir, _ = saved_by_4
    results = launch("restore", count, workdir)
    jobs.check(results)
    for res in (p.result for p in results):
        assert res["checked"] == 21
        assert res["rows_local_shards"] == 2
        assert res["fully_addressable"] == (count == 1)


@pytest.mark.slow  # 4 processes, one killed: ~52 s
def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    results = launch("kill", 4, tmp_path)
    assert results[KILL_PROCESS].returncode == -9, jobs.report(results)
    survivors = [p for p in results if p.index != KILL_PROCESS]
    jobs.check(survivors, lambda p: p.returncode == 0 and p.result.get("error") is not None)
    within = f"{jobs.KILL_COLLECTIVE_SECONDS:g} s"
    for p in survivors:
        res = p.result
        assert res["error"] == "CollectiveError", jobs.report(results)
        # The coordinator gave up on the killed process and told the others why.
        assert f"process(es) {KILL_PROCESS} did not reach the same call within {within}" in (
            res["message"]
        ), jobs.report(results)
        assert "nothing was committed" in res["message"]
        assert res["seconds"] < 3 * jobs.KILL_COLLECTIVE_SECONDS  # failed, did not hang
    directory = tmp_path / "ckpts"
    assert tp.latest_checkpoint(directory) == str(directory / "ckpt-1")
    names = sorted(p.name for p in directory.iterdir())
    assert "ckpt-2.index" not in names and not [n for n in names if "_temp" in n], names
    reader = tp.load_checkpoint(directory / "ckpt-1")
    assert reader.get_tensor("arrays/rows/.ATTRIBUTES/VARIABLE_VALUE").shape == (16, 4)


def test_jax_processes_save_and_restore_without_torch(tmp_path: Path) -> None:
    # Where torch is not installed (`pip install trackpoint[jax]`), trackpoint.distributed
    # works over jax.distributed; only the torch names say what is missing.
    results = launch("no-torch", 2, tmp_path)
    jobs.check(results)
    for res in (p.result for p in results):
        assert res["collective"] == "JaxCollective"
        assert "TorchCollective needs torch, which is not installed" in res["torch_name"]
        assert res["table"] is True  # the numpy Slice, restored from another process's rows
        assert len(res["checked"]) == 4
        assert res["loaded"] == []  # neither torch nor trackpoint's torch modules
    reader = tp.load_checkpoint(tmp_path / "ckpts" / "ckpt-1")
    np.testing.assert_array_equal(
        reader.get_tensor("table/.ATTRIBUTES/VARIABLE_VALUE"),
        np.arange(12, dtype=np.float32).reshape(4, 3),
    )


@pytest.mark.slow  # 2 processes, 3 saves: ~24 s
def test_rebinding_attributes_of_the_distributed_checkpoint_saves_the_new_values(
    tmp_path: Path,
) -> None:
    # Issue 27 finding 11: docs/jax.md's `ckpt.params = params` on a DistributedCheckpoint.
    results = launch("rebind", 2, tmp_path)
    jobs.check(results)
    for res in (p.result for p in results):
        assert res["paths"] == [str(tmp_path / "ckpts" / f"ckpt-{n}") for n in (1, 2, 3)]
        assert res["steps"] == [0, 1, 2]
        assert res["w_equals_version"] == [0, 1, 2]  # the rebound value of each save
        assert res["wrapper_reads_the_wrapped"] is True


@pytest.mark.slow  # 2 processes: ~27 s
def test_values_differing_between_processes_are_refused_and_per_process_ones_kept(
    tmp_path: Path,
) -> None:
    # Issue 27 finding 12: each process saved its own loader.pos; one was kept silently.
    results = launch("differ", 2, tmp_path)
    jobs.check(results)
    keys = {
        "python-int": "'loader/.ATTRIBUTES/py_state' (rank 0: '{\"pos\":100}'; "
                      "rank 1: '{\"pos\":101}')",
        "python-state": "'loader/.ATTRIBUTES/py_state' (rank 0: '{\"pos\": 100}'; "
                        "rank 1: '{\"pos\": 101}')",
        "numpy": "'w/.ATTRIBUTES/VARIABLE_VALUE' (rank 0: [0.0, 1.0, 2.0]; "
                 "rank 1: [1.0, 2.0, 3.0])",
        "jax-replicated": "'w/.ATTRIBUTES/VARIABLE_VALUE' (rank 0; rank 1)",
    }  # fmt: skip
    for res in (p.result for p in results):
        for case, named in keys.items():
            error = res["errors"][case]
            assert error is not None, case  # never saved with one process's value
            assert error["type"] == "InvalidArgumentError", error
            assert "differ between them" in error["message"], error
            assert named in error["message"], (case, error["message"])
            assert "same" not in error["message"].split(". ")[0]  # the equal value is fine
            assert error["latest"] is None  # nothing committed
            assert not list((tmp_path / case).glob("ckpt-1.index"))
        assert res["saved_pos"] == [100, 101]  # each process's own, as a slice by process
        assert res["restored_loader"] == 7
    assert [p.result["restored_pos"] for p in results] == [100, 101]
    assert [p.result["jax_restored_pos"] for p in results] == [100, 101]


# -- the collective over threads, with an in-memory key-value store ------------------------------


class FakeClient:
    """The coordination service client's key-value calls, in memory (thread-safe)."""

    def __init__(self) -> None:
        self.store: dict[str, str] = {}
        self.cond = threading.Condition()

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        with self.cond:
            assert allow_overwrite or key not in self.store, key
            self.store[key] = value
            self.cond.notify_all()

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.store, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
            return self.store[key]

    def key_value_try_get(self, key: str) -> str:
        with self.cond:
            if key not in self.store:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.store[key]

    def key_value_increment(self, key: str, increment: int) -> int:
        with self.cond:
            value = int(self.store.get(key, "0")) + increment
            self.store[key] = str(value)
            return value

    def key_value_delete(self, key: str) -> None:
        with self.cond:
            for name in [k for k in self.store if k == key or k.startswith(key + "/")]:
                del self.store[name]


def run_ranks(world: int, work: Any, *, timeout: float = 5.0, skip: int | None = None) -> list[Any]:
    client = FakeClient()
    collectives = [
        JaxCollective(client=client, rank=r, world_size=world, timeout=timeout, name="test")
        for r in range(world)
    ]
    out: list[Any] = [None] * world

    def target(rank: int) -> None:
        try:
            out[rank] = work(collectives[rank])
        except Exception as exc:
            out[rank] = exc

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world) if r != skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.append(client.store)
    return out


def test_jax_collective_exchanges_json_and_cleans_up_its_keys() -> None:
    def work(c: JaxCollective) -> Any:
        gathered = c.all_gather({"rank": c.rank})
        got = c.broadcast([c.rank, "x"], src=1)
        to_zero = c.gather(c.rank * 10, dst=0)
        part = c.scatter([f"for {r}" for r in range(c.world_size)] if c.rank == 2 else None, 2)
        return gathered, got, to_zero, part

    *outs, store = run_ranks(3, work)
    for rank, (gathered, got, to_zero, part) in enumerate(outs):
        assert gathered == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
        assert got == [1, "x"]
        assert to_zero == ([0, 10, 20] if rank == 0 else None)
        assert part == f"for {rank}"
    assert store == {}  # every call's keys deleted by the last process done with them


def test_jax_collective_names_the_process_that_never_came() -> None:
    *outs, _ = run_ranks(3, lambda c: c.all_gather(c.rank), timeout=0.3, skip=1)
    for rank in (0, 2):
        assert isinstance(outs[rank], CollectiveError)
        assert "process(es) 1 did not reach the same call within 0.3 s" in str(outs[rank])


def test_backend_argument() -> None:
    import trackpoint.distributed as tpd

    with pytest.raises(tp.errors.InvalidArgumentError, match="backend must be"):
        tpd.DistributedCheckpoint(x=np.zeros(2), backend="mpi")
    with pytest.raises(tp.errors.FailedPreconditionError, match="jax.distributed is not"):
        tpd.DistributedCheckpoint(x=np.zeros(2), backend="jax")
    assert tpd.DistributedCheckpoint(x=np.zeros(2)).world_size == 1
