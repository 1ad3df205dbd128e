"""Issue 18 (3-5): abstract restore targets (typed keys, Flax NNX), restoring without a target,
PRNG key implementations and weak_type recorded next to the value."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import trackpoint as tp  # noqa: E402
import trackpoint.integrations.jax as tpj  # noqa: E402
from trackpoint.errors import DataLossError, InvalidArgumentError  # noqa: E402
from trackpoint.management.reader import CheckpointReader  # noqa: E402
from trackpoint.tracking.base import Trackable  # noqa: E402
from trackpoint.tracking.python_state import string_scalar  # noqa: E402

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
META = "/.ATTRIBUTES/jax_metadata"


def _data(keys: Any) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys))


class Pair(NamedTuple):
    first: Any
    second: Any


@dataclasses.dataclass
class State:
    params: Any
    step: Any


jax.tree_util.register_dataclass(State, data_fields=["params", "step"], meta_fields=[])


class _Stored(Trackable):
    """Writes what an earlier version (or another program) would: raw values by name."""

    def __init__(self, **values: Any) -> None:
        self._values = values

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return dict(self._values)


# -- abstract targets -------------------------------------------------------------------------


def test_flax_abstract_target_with_dropout_restores_the_model(tmp_path):
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.linear = nnx.Linear(3, 4, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.dropout(self.linear(x))

    model = Model(nnx.Rngs(0, dropout=jax.random.key(7, impl="rbg")))
    model(jnp.ones((2, 3)))  # advances the dropout stream: the count and key are state too
    path = tp.Checkpoint(model=nnx.state(model)).write(tmp_path / "ckpt")
    # Flax's restore pattern: an abstract model, split into a graph and abstract state.
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: Model(nnx.Rngs(1, dropout=jax.random.key(0, impl="rbg"))))
    )
    restored = tpj.restore(path, {"model": abstract})
    twin = nnx.merge(graphdef, restored["model"])
    np.testing.assert_array_equal(twin.linear.kernel[...], model.linear.kernel[...])
    key, twin_key = model.dropout.rngs.key[...], twin.dropout.rngs.key[...]
    assert twin_key.dtype == key.dtype and jax.random.key_impl(twin_key) == "rbg"
    np.testing.assert_array_equal(_data(twin_key), _data(key))
    x = jnp.ones((2, 3))  # the same dropout masks from here on
    np.testing.assert_array_equal(twin(x), model(x))


def test_abstract_typed_keys_from_eval_shape(tmp_path):
    tree = {
        "rbg": jax.random.key(3, impl="rbg"),
        "batch": jax.random.split(jax.random.key(4), 5),
        "w": jnp.arange(4.0),
    }
    path = tpj.write(tmp_path / "ckpt", tree)
    restored = tpj.restore(path, jax.eval_shape(lambda: tree))
    for name in ("rbg", "batch"):
        assert restored[name].dtype == tree[name].dtype
        assert restored[name].shape == tree[name].shape
        np.testing.assert_array_equal(_data(restored[name]), _data(tree[name]))
    assert restored["w"].sharding == jnp.zeros(()).sharding


# -- key implementations ----------------------------------------------------------------------


def test_key_implementation_is_recorded_and_a_different_one_refused(tmp_path):
    key = jax.random.key(0, impl="rbg")
    path = tpj.write(tmp_path / "ckpt", {"params": {"w": jnp.ones(2)}, "rng": key})
    assert json.loads(tp.load_variable(path, "rng" + META).item()) == {"prng_impl": "rbg"}
    other = jax.random.key(0, impl="unsafe_rbg")  # the same four uint32 words of key data
    for target in (other, jax.eval_shape(lambda: other)):
        with pytest.raises(InvalidArgumentError) as info:
            tpj.restore(path, {"params": {"w": jnp.zeros(2)}, "rng": target})
        message = str(info.value)
        assert "['rng'] (rng/.ATTRIBUTES/VARIABLE_VALUE)" in message
        assert "'rbg'" in message and "'unsafe_rbg'" in message
    # threefry keys hold two words: the shapes differ, reported like any other leaf
    with pytest.raises(InvalidArgumentError, match=r"\['rng'\].*uint32\[4\].*uint32\[2\]"):
        tpj.restore(path, {"params": {"w": jnp.zeros(2)}, "rng": jax.random.key(0)})


def test_key_without_recorded_implementation_takes_the_targets(tmp_path):
    data = _data(jax.random.key(5, impl="unsafe_rbg"))
    path = tp.Checkpoint(rng=_Stored(VARIABLE_VALUE=data)).write(tmp_path / "old")
    restored = tpj.restore(path, {"rng": jax.random.key(0, impl="unsafe_rbg")})
    assert jax.random.key_impl(restored["rng"]) == "unsafe_rbg"
    np.testing.assert_array_equal(_data(restored["rng"]), data)
    raw = tpj.restore(
        tpj.write(tmp_path / "new", {"rng": jax.random.key(5, impl="rbg")}),
        {"rng": jnp.zeros(4, jnp.uint32)},
    )  # a uint32 target reads the key data
    np.testing.assert_array_equal(raw["rng"], _data(jax.random.key(5, impl="rbg")))


def test_damaged_or_unknown_key_metadata_is_an_error(tmp_path):
    words = np.zeros(2, np.uint32)
    bad = tp.Checkpoint(rng=_Stored(VARIABLE_VALUE=words, jax_metadata=string_scalar(b"[1]")))
    with pytest.raises(DataLossError, match=r"rng/\.ATTRIBUTES/jax_metadata.*metadata"):
        tpj.restore(bad.write(tmp_path / "bad"), {"rng": jax.random.key(0)})
    unknown = tp.Checkpoint(
        rng=_Stored(VARIABLE_VALUE=words, jax_metadata=string_scalar(b'{"prng_impl":"nope"}'))
    )
    with pytest.raises(InvalidArgumentError, match=r"\['rng'\].*'nope'.*with a target"):
        tpj.restore(unknown.write(tmp_path / "unknown"))


# -- weak_type --------------------------------------------------------------------------------


def test_weak_type_round_trip(tmp_path):
    lr = jnp.asarray(1e-3)  # weakly typed: bf16 * lr stays bf16
    assert lr.weak_type
    tree = {
        "lr": lr,
        "w": jnp.ones(3, jnp.bfloat16),
        "grid": jnp.full((2, 2), 0.5),
        "strong": jnp.float32(2.0),
    }
    path = tpj.write(tmp_path / "ckpt", tree)
    assert json.loads(tp.load_variable(path, "lr" + META).item()) == {"weak_type": True}
    assert not tp.load_checkpoint(path).has_tensor("strong" + META)
    for restored in (
        tpj.restore(path, tree),
        tpj.restore(path, jax.eval_shape(lambda: tree)),
        tpj.restore(path),
    ):
        assert restored["lr"].weak_type and restored["grid"].weak_type
        assert not restored["strong"].weak_type
        assert (restored["w"] * restored["lr"]).dtype == jnp.bfloat16
        assert float(restored["lr"]) == float(lr)
    # The target decides, as it does for dtype and sharding.
    strong = tpj.restore(path, {**tree, "lr": jnp.float32(0)})
    assert not strong["lr"].weak_type


# -- without a target -------------------------------------------------------------------------


def test_restore_without_target_returns_the_saved_tree(tmp_path):
    key = jax.random.key(1, impl="rbg")
    ckpt = tp.Checkpoint(
        params={
            "dense": {"w": jnp.arange(6.0).reshape(2, 3)},
            "layers": [jnp.ones(2), jnp.zeros(1)],
        },
        pair=Pair(jnp.ones(1), (jnp.zeros(2), jnp.ones(3))),
        state=State(params={"b": jnp.ones(2)}, step=jnp.asarray(4)),
        rng=key,
        config={"epoch": 3, "tags": ("a", "b"), "w": np.arange(2, dtype=np.float32)},
        mixed=[np.ones(2, np.float32), 7, "x"],
        wide=np.arange(3, dtype=np.int64),
    )
    path = ckpt.save(tmp_path / "ckpt")  # save_counter is bookkeeping: left out
    tree = tpj.restore(path)
    assert sorted(tree) == ["config", "mixed", "pair", "params", "rng", "state", "wide"]
    assert isinstance(tree["params"]["layers"], list) and len(tree["params"]["layers"]) == 2
    w = tree["params"]["dense"]["w"]
    assert isinstance(w, jax.Array) and w.sharding == jnp.zeros(()).sharding
    np.testing.assert_array_equal(w, np.arange(6.0).reshape(2, 3))
    assert sorted(tree["pair"]) == ["first", "second"]  # a namedtuple: by field name
    assert isinstance(tree["pair"]["second"], list)  # a tuple: by index
    assert sorted(tree["state"]) == ["params", "step"]  # a dataclass: by field name
    assert tree["state"]["step"].weak_type
    assert jax.random.key_impl(tree["rng"]) == "rbg"
    np.testing.assert_array_equal(_data(tree["rng"]), _data(key))
    # plain values of tracked containers are Python values, merged into their container
    assert tree["config"]["epoch"] == 3 and tree["config"]["tags"] == ("a", "b")
    assert isinstance(tree["config"]["w"], jax.Array)  # a numpy array is a tracked variable
    assert tree["mixed"][1:] == [7, "x"] and isinstance(tree["mixed"][0], jax.Array)
    # int64 does not fit a jax array without x64: numpy, never cast
    assert isinstance(tree["wide"], np.ndarray) and tree["wide"].dtype == np.int64
    single = tpj.restore(tpj.write(tmp_path / "single", jnp.arange(3)))
    np.testing.assert_array_equal(single, [0, 1, 2])


def test_restore_without_target_of_a_torch_module_and_optimizer(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    tree = tpj.restore(tp.Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "c"))
    assert isinstance(tree["model"], list) and tree["model"][1] is None  # ReLU saves nothing
    np.testing.assert_array_equal(tree["model"][0]["weight"], model[0].weight.detach().numpy())
    slots = tree["optimizer"][".OPTIMIZER_SLOT"]
    assert sorted(slots["model/2/bias"]) == ["exp_avg", "exp_avg_sq", "step"]
    np.testing.assert_array_equal(
        slots["model/0/weight"]["exp_avg"], optimizer.state[model[0].weight]["exp_avg"].numpy()
    )
    lr = tree["optimizer"]["param_groups"]["param_groups"][0]["hyperparameters"]["lr"]
    assert lr == 0.1


def test_restore_without_target_of_a_tensorflow_checkpoint(tmp_path, tf):
    tf.train.Checkpoint(
        params={"w": tf.Variable(np.ones((2, 2), np.float32))},
        layers=[tf.Variable(np.zeros(3, np.float32)), tf.Variable(np.ones(1, np.float32))],
        step=tf.Variable(5, dtype=tf.int32),
    ).save(str(tmp_path / "tf"))
    tree = tpj.restore(tmp_path)  # the directory's latest checkpoint
    assert sorted(tree) == ["layers", "params", "step"]
    assert isinstance(tree["layers"], list) and len(tree["layers"]) == 2
    np.testing.assert_array_equal(tree["params"]["w"], np.ones((2, 2)))
    assert int(tree["step"]) == 5


def test_restore_without_target_refuses_a_name_based_checkpoint(tmp_path, tf):
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", initializer=np.ones(2, np.float32))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(session, str(tmp_path / "v1"))
    with pytest.raises(InvalidArgumentError, match="no object graph.*load_checkpoint"):
        tpj.restore(path)


# -- TensorFlow reads the metadata ------------------------------------------------------------


def test_tensorflow_reads_checkpoints_with_jax_metadata(tmp_path, tf):
    tree = {"lr": jnp.asarray(0.5), "w": jnp.arange(3.0), "rng": jax.random.key(2)}
    path = tpj.write(tmp_path / "ckpt", tree)
    reader = tf.train.load_checkpoint(path)
    assert json.loads(reader.get_tensor("lr" + META)) == {"weak_type": True}
    assert json.loads(reader.get_tensor("rng" + META)) == {"prng_impl": "threefry2x32"}
    np.testing.assert_array_equal(reader.get_tensor("rng" + VALUE), _data(tree["rng"]))
    lr, w = tf.Variable(0.0), tf.Variable(np.zeros(3, np.float32))
    rng = tf.Variable(np.zeros(2, np.uint32))
    tf.train.Checkpoint(lr=lr, w=w, rng=rng).read(path).assert_consumed()
    assert float(lr.numpy()) == 0.5
    np.testing.assert_array_equal(rng.numpy(), _data(tree["rng"]))
    with CheckpointReader(path) as ours:  # and arrays that are neither write nothing extra
        assert not ours.has_tensor("w" + META)


# -- sharded abstract targets (4 simulated devices, in a subprocess) --------------------------

_SHARDED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import trackpoint.integrations.jax as tpj
mesh = jax.make_mesh((4,), ("x",))
rows = NamedSharding(mesh, P("x"))
tree = {"w": jax.device_put(jnp.arange(16.0).reshape(8, 2), rows),
        "keys": jax.device_put(jax.random.split(jax.random.key(0, impl="rbg"), 4), rows),
        "grid": jax.device_put(jnp.full((4,), 0.5), rows)}
path = tpj.write(sys.argv[1], tree)
replicated = NamedSharding(mesh, P())
target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated,
                                   weak_type=getattr(x, "weak_type", False)), tree)
out = tpj.restore(path, target)
print(json.dumps({
    "devices": len(jax.devices()),
    "shardings": [out[k].sharding.is_equivalent_to(replicated, out[k].ndim)
                  for k in ("w", "keys", "grid")],
    "w": bool((np.asarray(out["w"]) == np.asarray(tree["w"])).all()),
    "keys": str(out["keys"].dtype),
    "key_data": bool((np.asarray(jax.random.key_data(out["keys"]))
                      == np.asarray(jax.random.key_data(tree["keys"]))).all()),
    "weak": out["grid"].weak_type,
}))
"""


def test_sharded_abstract_targets_with_keys_and_weak_types(tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    result = subprocess.run(
        [sys.executable, "-c", _SHARDED, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "devices": 4,
        "shardings": [True, True, True],
        "w": True,
        "keys": "key<rbg>",
        "key_data": True,
        "weak": True,
    }


def test_numpy_restore_of_a_jax_checkpoint_is_consumed_despite_jax_metadata(tmp_path):
    """``jax_metadata`` describes a value (weak_type, key impl): a numpy holder that cannot use
    it loses nothing, so the restore does not call it unused."""
    import numpy as np

    import trackpoint as tp

    path = tp.Checkpoint(lr=jnp.asarray(0.5)).write(str(tmp_path / "ckpt"))  # weakly typed
    assert any(k.endswith("jax_metadata") for k, _ in tp.list_variables(path))
    holder = np.zeros((), np.float32)
    tp.Checkpoint(lr=holder).read(path).assert_consumed()
    assert holder == 0.5
