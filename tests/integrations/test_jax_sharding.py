"""Sharded jax.Arrays on 8 simulated devices: slices on save, any sharding on restore.

JAX reads XLA_FLAGS once, when its backend starts, so the scenarios run in one subprocess
(jax_sharding_worker.py) that records what it observed; each test checks one observation.
TensorFlow then reads the sharded checkpoint in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

WORKER = Path(__file__).with_name("jax_sharding_worker.py")
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("jax_sharding")
    result = subprocess.run(
        [sys.executable, str(WORKER), str(directory)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return directory, json.loads((directory / "results.json").read_text())


def test_worker_sees_eight_devices(run):
    assert run[1]["devices"] == 8


def test_each_distinct_shard_is_one_slice_and_replicas_are_written_once(run):
    slices = run[1]["slices"]
    # P("x", "y") on a 4x2 mesh: 8 boxes of 2x6.
    assert slices["a"] == [f"{r},2:{c},6" for r in (0, 2, 4, 6) for c in (0, 6)]
    # P("x", None): each row block lives on 2 devices, stored once.
    assert slices["b"] == [f"{r},2:0,12" for r in (0, 2, 4, 6)]
    # Fully replicated: an ordinary unsliced tensor.
    assert slices["r"] == []


@pytest.mark.parametrize(
    "case", ["a_by_b_a", "b_by_cols", "a_replicated", "r_rows8", "a_one_device"]
)
@pytest.mark.parametrize("kind", ["abstract", "concrete"])
def test_restore_places_values_on_any_target_sharding(run, case, kind):
    assert run[1]["placed"][f"{case}/{kind}"] is True


def test_restore_reads_one_box_per_target_shard_touching_only_stored_slices_it_meets(run):
    reads = run[1]["reads_sliced"]
    boxes = [box for what, box in reads if what == "read_slice"]
    assert boxes == [f"{row},1:0,12" for row in range(8)]  # one row per device
    # Each one-row box meets the two stored 2x6 slices of its row block (of 8 stored slices).
    value_reads = [key for what, key in reads if what == "entry" and key.startswith("a/")]
    assert len(value_reads) == 2 * 8


def test_restore_maps_an_unsliced_tensor_once_for_all_target_shards(run):
    reads = run[1]["reads_unsliced"]
    assert [key for what, key in reads if what == "entry" and key.startswith("r/")] == [
        f"r{VALUE}"
    ]


def test_checkpoint_of_sharded_optax_state_restores_on_another_mesh(run):
    assert run[1]["checkpoint_optax"] is True


def test_tensorflow_reads_sharded_arrays_whole(run, tf):
    directory = run[0]
    reader = tf.train.load_checkpoint(str(directory / "sharded"))
    with np.load(directory / "expected.npz") as expected:
        for name in ("a", "b", "r"):
            got = reader.get_tensor(f"{name}{VALUE}")
            assert str(got.dtype) == run[1]["dtypes"][name]
            assert got.tobytes() == expected[name].tobytes(), name
