"""Saves and restores by real gloo process groups (2-4 CPU processes, see dist_worker.py).

One 4-rank run saves the sharded + replicated model twice (sync, then async with the values
changed right after the snapshot) and then a save one rank fails; its checkpoints are restored
on 1, 2 and 3 ranks with other slicings, read whole by ``tp.load_checkpoint`` and by TensorFlow.
Two-rank runs: a rank killed mid-save, ``CheckpointManager`` on every rank followed by a save
one live rank never joins, S3.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
# Every test runs gloo process groups or reads the checkpoints of the 4-rank run (a module
# fixture, ~45 s on a loaded 2-core machine); each took 18 s or more there.
pytestmark = pytest.mark.slow

import jobs  # noqa: E402
from dist_helpers import DT, build, key, launch, reference, report  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.distributed.read_plan import IndexView  # noqa: E402
from trackpoint.storage import LocalStorage  # noqa: E402


def expected_ckpt2() -> dict[str, np.ndarray]:
    """ckpt-2 of the 4-rank run: the parameters moved by 1 after ckpt-1, the slots unchanged."""
    return {k: v + np.float32(1) if "OPTIMIZER_SLOT" not in k else v
            for k, v in reference(1).items()}


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work folder of the 4-rank ``save`` run (its checkpoints are in ``ckpts/``)."""
    workdir = tmp_path_factory.mktemp("saved-by-4")
    results = launch("save", 4, workdir)
    jobs.check(results)
    return workdir


def test_4_ranks_save_sharded_and_replicated_values_into_one_checkpoint(saved_by_4: Path) -> None:
    directory = saved_by_4 / "ckpts"
    assert tp.latest_checkpoint(directory) == str(directory / "ckpt-2")
    names = sorted(p.name for p in directory.iterdir())
    data = [n for n in names if n.startswith("ckpt-2.data-")]
    assert len(data) == 4 and "ckpt-3.index" not in names  # one shard per rank; failed save
    assert not [n for n in names if "_temp_" in n]
    first = tp.load_checkpoint(directory / "ckpt-1")
    for k, value in reference(1).items():
        np.testing.assert_array_equal(first.get_tensor(k), value, err_msg=k)
    second = tp.load_checkpoint(directory / "ckpt-2")
    for k, value in expected_ckpt2().items():  # the async save holds the snapshot's values
        np.testing.assert_array_equal(second.get_tensor(k), value, err_msg=k)

    index = IndexView.load(str(directory / "ckpt-2"), LocalStorage())
    slices = {k: len(index.ranges(k)) for k in index.keys()}
    assert slices[key("emb.weight")] == 4  # one row block per rank
    assert slices[key("dt")] == 3  # torch gives the 4th rank no rows of 6
    assert slices[key("flat")] > 4  # flat runs cut into boxes
    assert slices[key("lin.weight")] == 1  # replicated: written once
    writers = {index.index.layout(key(name)).shard_id for name in ("lin.weight", "lin.bias")}
    assert writers  # written by some rank; balancing is tested in test_dist_plan.py


@pytest.mark.parametrize("world", [2, 3])
def test_restore_on_other_world_sizes_reads_equal_values(saved_by_4: Path, world: int) -> None:
    results = launch("restore", world, saved_by_4, str(saved_by_4 / "ckpts"))
    jobs.check(results)


def test_restore_in_one_process_without_torch_distributed(saved_by_4: Path) -> None:
    import torch

    import trackpoint.distributed as tpd

    model, optimizer = build(0, 1, 9, dtensor=False)
    model.dt = torch.nn.Parameter(torch.zeros(DT))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer)
    assert ckpt.world_size == 1
    ckpt.restore(saved_by_4 / "ckpts").assert_consumed()
    expected = expected_ckpt2()
    for name, param in model.named_parameters():
        np.testing.assert_array_equal(
            param.detach().numpy().reshape(expected[key(name)].shape), expected[key(name)]
        )
        state = optimizer.state[param]["exp_avg"].numpy()
        np.testing.assert_array_equal(
            state.reshape(expected[key(name)].shape), expected[key(name, "exp_avg")]
        )


@pytest.mark.interop
def test_tensorflow_reads_the_4_rank_checkpoint_as_full_tensors(tf, saved_by_4: Path) -> None:  # noqa: ANN001
    reader = tf.train.load_checkpoint(str(saved_by_4 / "ckpts" / "ckpt-2"))
    shapes = reader.get_variable_to_shape_map()
    for k, value in expected_ckpt2().items():
        assert shapes[k] == list(value.shape), k
        np.testing.assert_array_equal(reader.get_tensor(k), value, err_msg=k)


@pytest.mark.parametrize("victim", [0, 1], ids=["coordinator-dies", "other-rank-dies"])
def test_rank_killed_mid_save_fails_the_save_everywhere(tmp_path: Path, victim: int) -> None:
    results = launch("kill", 2, tmp_path, str(victim))
    survivor = 1 - victim
    assert results[victim].returncode == 3, report(results)
    assert results[survivor].returncode == 0, report(results)
    assert "save failed after" in results[survivor].stdout
    out = results[survivor].stdout
    assert "Saving checkpoint" in out and "ckpt-2 failed, nothing was committed" in out
    assert "exchanging messages with the other 1 rank(s) failed" in out
    directory = tmp_path / "ckpts"
    assert tp.latest_checkpoint(directory) == str(directory / "ckpt-1")
    assert not (directory / "ckpt-2.index").exists()
    temps = [p for p in directory.iterdir() if "_temp_" in p.name]
    # The coordinator's folder outlives it; a surviving coordinator removes its own at once.
    assert len(temps) == (1 if victim == 0 else 0)
    tp.Checkpoint(x=np.zeros(3)).save(directory / "other")  # the next save in the folder
    assert not [p for p in directory.iterdir() if "_temp_" in p.name]
    reader = tp.load_checkpoint(directory / "ckpt-1")
    np.testing.assert_array_equal(reader.get_tensor(key("lin.weight")),
                                  reference(1)[key("lin.weight")])


def test_checkpoint_manager_on_2_ranks_and_a_rank_that_never_joins(tmp_path: Path) -> None:
    results = launch("manager", 2, tmp_path)
    jobs.check(results)
    out = results[0].stdout
    assert "stalled save failed after" in out, report(results)
    waited = float(out.split("stalled save failed after ")[1].split(" s")[0])
    assert 2.5 <= waited < 30, out
    assert "nothing was committed" in out and "did not reach the same call within 3 s" in out
    assert not [p for p in (tmp_path / "stalled").iterdir() if "_temp_" in p.name]


def test_save_and_restore_on_s3(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/{uuid.uuid4().hex}"
    results = launch("s3", 2, tmp_path, root, env={"TP_S3_ENDPOINT": s3_endpoint})
    jobs.check(results)
