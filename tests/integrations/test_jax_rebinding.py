"""Issue 13 part 2: a save writes the values reachable at the moment of the call, never an
earlier save's: rebinding entries of the dict or list handed to a Checkpoint (JAX arrays are
immutable, so every step rebinds), numpy rebinding, donated (deleted) jax arrays, NNX views."""

from __future__ import annotations

import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import trackpoint as tp  # noqa: E402
import trackpoint.integrations.jax as tpj  # noqa: E402
from trackpoint.errors import FailedPreconditionError  # noqa: E402
from trackpoint.integrations.jax_pytrees import leaves_with_names  # noqa: E402

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _value(path: str, key: str) -> np.ndarray:
    return np.asarray(tp.load_variable(path, key + VALUE))


def test_rebinding_a_jax_entry_saves_the_new_array(tmp_path):
    state = {"w": jnp.zeros(2)}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(tmp_path / "a")
    state["w"] = jnp.ones(2)  # the usual JAX step: rebind, arrays are immutable
    assert _value(ckpt.write(tmp_path / "b"), "state/w").tolist() == [1.0, 1.0]
    fresh = tp.Checkpoint(state=state).write(tmp_path / "c")
    assert _value(fresh, "state/w").tolist() == [1.0, 1.0]
    assert _value(tpj.write(tmp_path / "d", state), "w").tolist() == [1.0, 1.0]


def test_rebinding_nested_entries_scalars_and_structure(tmp_path):
    state = {"params": {"w": jnp.zeros(2), "layers": [jnp.zeros(1)]}, "step": 0}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(tmp_path / "a")
    for step in range(1, 4):
        state["params"] = {"w": state["params"]["w"] + 1, "layers": [jnp.full(1, step)]}
        state["step"] = step
        path = ckpt.write(tmp_path / f"step{step}")
        assert _value(path, "state/params/w").tolist() == [step, step]
        assert _value(path, "state/params/layers/0").tolist() == [step]
        assert _value(path, "state/step") == step
    state["extra"] = jnp.ones(3)  # a new entry is a new child; a dropped one is gone
    del state["step"]
    names = [name for name, _ in tp.list_variables(ckpt.write(tmp_path / "more"))]
    assert "state/extra" + VALUE in names and "state/step" + VALUE not in names


def test_restore_into_the_rebinding_pattern_returns_new_pytrees(tmp_path):
    state = {"w": jnp.zeros(2), "step": 0}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(tmp_path / "a")
    state["w"], state["step"] = jnp.full(2, 3.0), 7
    path = ckpt.write(tmp_path / "b")
    restored = tpj.restore(path, {"state": {"w": jnp.zeros(2), "step": 0}})
    assert restored["state"]["step"] == 7
    np.testing.assert_array_equal(restored["state"]["w"], [3.0, 3.0])


def test_numpy_rebinding_saves_and_restores_in_place(tmp_path):
    state = {"w": np.zeros(2), "layers": [np.zeros(1)]}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(tmp_path / "a")
    state["w"] = np.ones(2)  # rebinding on the dict the caller passed
    state["layers"][0] = np.full(1, 2.0)  # and on a list inside it
    path = ckpt.write(tmp_path / "b")
    assert _value(path, "state/w").tolist() == [1.0, 1.0]
    assert _value(path, "state/layers/0").tolist() == [2.0]
    current = np.full(2, 9.0)
    state["w"] = current  # rebound again before a restore
    ckpt.read(path).assert_consumed()
    assert state["w"] is current and current.tolist() == [1.0, 1.0]  # copied in place


def test_numpy_list_handed_to_the_checkpoint(tmp_path):
    params = [np.zeros(2), np.zeros(1)]
    ckpt = tp.Checkpoint(params=params)
    ckpt.write(tmp_path / "a")
    params[0] = np.ones(2)
    ckpt.params[1] = np.full(1, 5.0)  # through the tracked list too (TensorFlow allows it)
    path = ckpt.write(tmp_path / "b")
    assert _value(path, "params/0").tolist() == [1.0, 1.0]
    assert _value(path, "params/1").tolist() == [5.0]


def test_mixed_rebinding_between_numpy_and_jax(tmp_path):
    numpy_state = {"w": np.zeros(2)}
    ckpt = tp.Checkpoint(state=numpy_state)
    ckpt.write(tmp_path / "a")
    numpy_state["w"] = jnp.ones(2)
    assert _value(ckpt.write(tmp_path / "b"), "state/w").tolist() == [1.0, 1.0]
    jax_state = {"w": jnp.zeros(2)}
    ckpt = tp.Checkpoint(state=jax_state)
    ckpt.write(tmp_path / "c")
    jax_state["w"] = np.full(2, 3.0)
    path = ckpt.write(tmp_path / "d")
    assert _value(path, "state/w").tolist() == [3.0, 3.0]
    target = jax_state["w"]
    ckpt.read(path).assert_consumed()  # numpy leaves of a pytree view restore in place
    assert jax_state["w"] is target


def test_donated_jax_array_fails_naming_its_path(tmp_path):
    step = jax.jit(lambda x: x * 2, donate_argnums=0)
    state = {"params": {"w": jnp.ones(2)}}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(tmp_path / "a")
    step(state["params"]["w"])  # the result was not rebound: the entry is a deleted array
    with pytest.raises(FailedPreconditionError, match=r"Cannot save \(root\)\.state\.params\.w.*"
                       r"deleted.*donat.*rebind"):
        ckpt.write(tmp_path / "b")
    assert not os.path.exists(tmp_path / "b.index")
    with pytest.raises(FailedPreconditionError, match=r"\(root\)\.params\.w.*deleted"):
        tpj.write(tmp_path / "c", state)
    state["params"]["w"] = step(jnp.ones(2))  # rebinding the step's result: saves again
    assert _value(ckpt.write(tmp_path / "d"), "state/params/w").tolist() == [2.0, 2.0]


def test_deleted_array_attached_directly(tmp_path):
    array = jnp.ones(3)
    ckpt = tp.Checkpoint(array=array)
    array.delete()
    with pytest.raises(FailedPreconditionError, match=r"Cannot save \(root\)\.array.*deleted"):
        ckpt.write(tmp_path / "a")


def test_entry_added_outside_the_tracked_dict_while_a_restore_waits(tmp_path):
    path = tp.Checkpoint(state={"w": np.ones(2)}).write(tmp_path / "a")
    state: dict[str, np.ndarray] = {}
    ckpt = tp.Checkpoint(state=state)
    status = ckpt.read(path)
    state["w"] = np.zeros(2)  # not through ckpt.state: the restore cannot run on assignment
    with pytest.raises(FailedPreconditionError, match="'w' was set on the dict itself.*ckpt"):
        ckpt.write(tmp_path / "b")
    ckpt.state["w"] = state["w"]  # the fix the message names: the waiting restore runs now
    assert state["w"].tolist() == [1.0, 1.0]
    status.assert_consumed()
    ckpt.write(tmp_path / "b")


def test_flax_nnx_state_view_saves_current_values(tmp_path):
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    view = nnx.state(model)
    ckpt = tp.Checkpoint(state=view)
    ckpt.write(tmp_path / "a")
    model.kernel[...] = model.kernel[...] + 1.0
    model.bias[...] = model.bias[...] - 1.0
    for path, tree in ((ckpt.write(tmp_path / "b"), view),
                       (tp.Checkpoint(state=nnx.state(model)).write(tmp_path / "c"),
                        nnx.state(model))):
        leaves, _ = leaves_with_names(tree)
        assert leaves
        for names, _, leaf in leaves:  # what the view holds at the moment of the call
            np.testing.assert_array_equal(_value(path, "/".join(("state", *names))), leaf)
    fresh = nnx.state(model)
    np.testing.assert_array_equal(
        next(
            _value(str(tmp_path / "c"), "/".join(("state", *names)))
            for names, _, leaf in leaves_with_names(fresh)[0]
            if getattr(leaf, "shape", None) == (2, 3)
        ),
        model.kernel[...],
    )


def test_rebinding_on_a_distributed_checkpoint_saves_the_new_trees(tmp_path):
    # Issue 27 finding 11: docs/jax.md's multi-process pattern, here in one process (the
    # 2-process job is tests/distributed/test_jax_processes.py).
    import trackpoint.distributed as tpd

    params = {"w": jnp.zeros(2)}
    ckpt = tpd.DistributedCheckpoint(params=params, step=jnp.asarray(0))
    first = ckpt.save(tmp_path / "ckpt")
    ckpt.params, ckpt.step = {"w": jnp.ones(2)}, jnp.asarray(5)  # a step's new trees
    second = ckpt.save(tmp_path / "ckpt")
    assert ckpt.checkpoint.params is ckpt.params
    assert _value(first, "params/w").tolist() == [0.0, 0.0] and _value(first, "step") == 0
    assert _value(second, "params/w").tolist() == [1.0, 1.0] and _value(second, "step") == 5
    restored = tpj.restore(second, {"params": params, "step": jnp.asarray(0)})
    np.testing.assert_array_equal(restored["params"]["w"], [1.0, 1.0])
