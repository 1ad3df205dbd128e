"""Resuming a CheckpointManager continues its numbering, JAX state included (issue 27 #13).

A new run's manager over ``ckpt-1..3`` used to fail at its first save (its ``save_counter`` is 0
when the state was not restored in place, as with ``tp.jax.restore``), pointing at
``restore_or_initialize()``, which refuses JAX arrays. Now an unnumbered save continues after the
directory's checkpoints, and ``tp.jax.restore_or_initialize(manager)`` resumes JAX state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import DataLossError, FailedPreconditionError, InvalidArgumentError
from trackpoint.management.state_file import write_checkpoint_state

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
tpj = pytest.importorskip("trackpoint.integrations.jax")


def _index_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.index"))


def _jax_run(directory: Path, saves: int = 3) -> None:
    """A run that saved ``ckpt-1..saves``; ``ckpt-N`` holds params w = N, step = 10 N."""
    ckpt = tp.Checkpoint(params={"w": jnp.zeros(3)}, step=jnp.asarray(0))
    with tp.CheckpointManager(ckpt, directory, max_to_keep=3) as manager:
        for n in range(1, saves + 1):
            ckpt.params, ckpt.step = {"w": jnp.full(3, float(n))}, jnp.asarray(10 * n)
            manager.save()


def test_an_unrestored_manager_numbers_on_after_the_directory(tmp_path: Path) -> None:
    with tp.CheckpointManager(tp.Checkpoint(w=np.zeros(2)), tmp_path, max_to_keep=3) as first:
        for _ in range(3):
            first.save()
    ckpt = tp.Checkpoint(w=np.full(2, 7.0))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3) as manager:
        assert manager.save() == str(tmp_path / "ckpt-4")
        assert int(ckpt.save_counter.numpy()) == 4
        assert manager.save() == str(tmp_path / "ckpt-5")
        assert manager.checkpoints == [str(tmp_path / f"ckpt-{n}") for n in (3, 4, 5)]
    assert _index_files(tmp_path) == ["ckpt-3.index", "ckpt-4.index", "ckpt-5.index"]
    counter = tp.load_variable(str(tmp_path / "ckpt-5"), "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert counter == 5


def test_jax_state_resumes_with_restore_or_initialize_and_numbering_continues(
    tmp_path: Path,
) -> None:
    _jax_run(tmp_path)
    params = {"w": jnp.zeros(3)}
    ckpt = tp.Checkpoint(params=params, step=jnp.asarray(0))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3) as manager:
        with pytest.raises(FailedPreconditionError, match=r"tp\.jax\.restore_or_initialize"):
            manager.restore_or_initialize()  # in place: JAX arrays refuse
        state, path = tpj.restore_or_initialize(manager)
        assert path == str(tmp_path / "ckpt-3")
        np.testing.assert_array_equal(state["params"]["w"], 3.0)
        assert int(state["step"]) == 30
        assert ckpt.params is state["params"] and ckpt.step is state["step"]  # rebound
        assert params["w"] is not state["params"]["w"]  # the old tree is left alone
        assert int(ckpt.save_counter.numpy()) == 3
        ckpt.params = {"w": ckpt.params["w"] + 1.0}
        assert manager.save() == str(tmp_path / "ckpt-4")
    restored = tpj.restore(str(tmp_path / "ckpt-4"), {"params": params, "step": 0})
    np.testing.assert_array_equal(restored["params"]["w"], 4.0)
    assert restored["step"] == 30
    assert _index_files(tmp_path) == ["ckpt-2.index", "ckpt-3.index", "ckpt-4.index"]


def test_an_explicit_target_is_returned_and_nothing_is_rebound(tmp_path: Path) -> None:
    _jax_run(tmp_path)
    params = {"w": jnp.zeros(3)}
    ckpt = tp.Checkpoint(params=params, step=jnp.asarray(0))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3) as manager:
        abstract = {"params": {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}}
        state, path = tpj.restore_or_initialize(manager, abstract, partial=True)
        assert path == str(tmp_path / "ckpt-3")
        np.testing.assert_array_equal(state["params"]["w"], 3.0)
        assert ckpt.params is params  # not rebound
        assert manager.save() == str(tmp_path / "ckpt-4")  # the counter was restored


def test_without_a_checkpoint_init_fn_runs_and_the_target_comes_back(tmp_path: Path) -> None:
    calls: list[int] = []
    params = {"w": jnp.ones(3)}
    ckpt = tp.Checkpoint(params=params)
    with tp.CheckpointManager(
        ckpt, tmp_path, max_to_keep=3, init_fn=lambda: calls.append(1)
    ) as manager:
        state, path = tpj.restore_or_initialize(manager)
        assert path is None and calls == [1]
        assert state == {"params": params}
        assert manager.save() == str(tmp_path / "ckpt-1")


def test_a_mismatched_target_changes_nothing(tmp_path: Path) -> None:
    _jax_run(tmp_path)
    params = {"w": jnp.zeros(4)}  # another shape
    ckpt = tp.Checkpoint(params=params, step=jnp.asarray(0))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3) as manager:
        with pytest.raises(InvalidArgumentError, match="shape"):
            tpj.restore_or_initialize(manager)
        assert ckpt.params is params
        assert int(ckpt.save_counter.numpy()) == 0
    with tp.CheckpointManager(tp.Checkpoint(root=tp.Checkpoint()), tmp_path, max_to_keep=3) as m:
        with pytest.raises(InvalidArgumentError, match="pass the target"):
            tpj.restore_or_initialize(m)


@pytest.mark.parametrize("counter", [np.int64(-1), np.float32(2.0), np.arange(3)])
def test_a_bad_saved_counter_is_refused_before_anything_changes(
    tmp_path: Path, counter: Any
) -> None:
    prefix = str(tmp_path / "ckpt-2")
    tpj.write(prefix, {"params": {"w": jnp.full(3, 2.0)}, "save_counter": counter})
    write_checkpoint_state(tmp_path, prefix)
    params = {"w": jnp.zeros(3)}
    ckpt = tp.Checkpoint(params=params)
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3) as manager:
        with pytest.raises(DataLossError, match="save_counter"):
            tpj.restore_or_initialize(manager, {"params": params}, partial=True)
        assert ckpt.params is params and int(ckpt.save_counter.numpy()) == 0
        assert manager.save() == str(tmp_path / "ckpt-3")  # numbering still continues


_NEW_PROCESS = """
import sys
import jax.numpy as jnp
import trackpoint as tp
directory = sys.argv[1]
ckpt = tp.Checkpoint(params={"w": jnp.zeros(3)}, step=jnp.asarray(0))
manager = tp.CheckpointManager(ckpt, directory, max_to_keep=3)
if sys.argv[2] == "resume":
    state, path = tp.jax.restore_or_initialize(manager)
    print(path, float(state["params"]["w"][0]))
print(manager.save())
manager.close()
"""


@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_new_process_continues_the_numbering(tmp_path: Path, how: str) -> None:
    _jax_run(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", _NEW_PROCESS, str(tmp_path), how],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    if how == "resume":
        assert lines.pop(0) == f"{tmp_path / 'ckpt-3'} 3.0"
    assert lines[0] == str(tmp_path / "ckpt-4")
    assert _index_files(tmp_path) == ["ckpt-2.index", "ckpt-3.index", "ckpt-4.index"]
    saved: Any = tpj.restore(str(tmp_path / "ckpt-4"), {"params": {"w": jnp.zeros(3)}, "step": 0})
    np.testing.assert_array_equal(saved["params"]["w"], 3.0 if how == "resume" else 0.0)
