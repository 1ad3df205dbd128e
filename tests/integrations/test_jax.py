"""JAX pytrees in checkpoints on one device: keys, restore, mismatches, dtypes, TensorFlow.

Sharded arrays (8 simulated devices) are in test_jax_sharding.py, the fresh-process training
resume in test_jax_resume.py; both run JAX in a subprocess.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

import trackpoint.integrations.jax as tpj  # noqa: E402
from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError  # noqa: E402
from trackpoint.integrations.jax_pytrees import leaves_with_names  # noqa: E402
from trackpoint.management.reader import CheckpointReader  # noqa: E402

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _params() -> dict[str, Any]:
    return {
        "dense": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.array([0.5, -1.0, 2.0])},
        "blocks": [{"scale": jnp.ones(3, jnp.bfloat16)}],
    }


def _keys(prefix: str) -> list[str]:
    with CheckpointReader(prefix) as reader:
        return sorted(k for k in reader.keys() if not k.startswith("_"))


def _same(a: Any, b: Any) -> None:
    """Same structure and container types, leaves bit-identical with equal dtypes."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@dataclasses.dataclass
class TrainState:
    params: Any
    step: Any


jax.tree_util.register_dataclass(TrainState, data_fields=["params", "step"], meta_fields=[])


class Pair(NamedTuple):
    first: Any
    second: Any


# -- saving ---------------------------------------------------------------------------------


def test_checkpoint_leaves_user_pytrees_untouched(tmp_path):
    params = _params()
    opt_state = optax.adam(1e-3).init(params)
    structure = jax.tree_util.tree_structure((params, opt_state))
    ckpt = Checkpoint(params=params, opt_state=opt_state, step=jnp.asarray(3))
    ckpt.write(str(tmp_path / "ckpt"))
    assert type(params["dense"]) is dict and type(params["blocks"]) is list
    assert type(params["blocks"][0]) is dict
    assert jax.tree_util.tree_structure((params, opt_state)) == structure
    loss = jax.jit(lambda p: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(p)))
    assert float(loss(params)) == pytest.approx(19.5)


def test_numpy_containers_keep_in_place_semantics_while_jax_is_loaded(tmp_path):
    weights = {"dense": {"w": np.zeros(3)}, 1: "not a pytree jax can sort"}
    ckpt = Checkpoint(state=weights)
    assert type(weights["dense"]) is dict  # tracked, but the user's dict is never replaced
    inner = weights["dense"]["w"]
    inner[:] = 1.0
    prefix = ckpt.write(str(tmp_path / "ckpt"))
    inner[:] = 5.0
    ckpt.read(prefix).assert_consumed()
    np.testing.assert_array_equal(inner, np.ones(3))


def test_checkpoint_keys_are_dict_keys_indices_and_field_names(tmp_path):
    params = _params()
    opt_state = optax.adam(1e-3).init(params)
    prefix = Checkpoint(params=params, opt_state=opt_state, step=jnp.asarray(3)).write(
        str(tmp_path / "ckpt")
    )
    leaves = ["blocks/0/scale", "dense/b", "dense/w"]
    expected = (
        [f"params/{leaf}{VALUE}" for leaf in leaves]
        + [f"opt_state/0/count{VALUE}"]
        + [f"opt_state/0/{slot}/{leaf}{VALUE}" for slot in ("mu", "nu") for leaf in leaves]
        + [f"step{VALUE}", "step/.ATTRIBUTES/jax_metadata"]  # jnp.asarray(3) is weakly typed
    )
    assert _keys(prefix) == sorted(expected)
    with CheckpointReader(prefix) as reader:
        np.testing.assert_array_equal(reader.get_tensor(f"params/dense/w{VALUE}"),
                                      np.arange(6.0, dtype=np.float32).reshape(2, 3))
        assert reader.get_tensor(f"step{VALUE}") == 3


def test_write_matches_checkpoint_write_key_for_key(tmp_path):
    tree = {"params": _params(), "step": jnp.asarray(7, jnp.int32), "epoch": 2}
    a = tpj.write(tmp_path / "a", tree)
    b = Checkpoint(params=tree["params"], step=tree["step"], epoch=jnp.asarray(2, jnp.int32)).write(
        str(tmp_path / "b")
    )
    assert _keys(a) == _keys(b)


def test_unsupported_leaves_are_refused_with_their_path(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"leaf \['name'\] is a str"):
        Checkpoint(params={"w": jnp.ones(2), "name": "mlp"})
    with pytest.raises(InvalidArgumentError, match=r"\['x'\].*float8_e3m4"):
        tpj.write(tmp_path / "c", {"x": jnp.ones(2, jnp.float8_e3m4)})
    with pytest.raises(InvalidArgumentError, match=r"\['x'\].*ShapeDtypeStruct"):
        tpj.write(tmp_path / "c", {"x": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(InvalidArgumentError, match="same checkpoint name '1'"):
        tpj.write(tmp_path / "c", OrderedDict([(1, jnp.ones(2)), ("1", jnp.zeros(2))]))
    with pytest.raises(InvalidArgumentError, match="cannot flatten"):
        tpj.write(tmp_path / "c", {1: jnp.ones(2), "1": jnp.zeros(2)})  # unsortable keys
    assert not (tmp_path / "c.index").exists()


def test_write_rejects_enable_async(tmp_path):
    from trackpoint.saving import CheckpointOptions

    with pytest.raises(InvalidArgumentError, match="enable_async"):
        tpj.write(tmp_path / "c", {"x": jnp.ones(2)}, options=CheckpointOptions(enable_async=True))


# -- restoring ------------------------------------------------------------------------------


def test_restore_returns_new_tree_of_every_container_and_leaf_kind(tmp_path):
    tree = {
        "state": TrainState(params=_params(), step=jnp.asarray(5)),
        "pair": Pair(jnp.ones((2, 2), jnp.int8), (np.arange(3, dtype=np.int16), None)),
        "scalars": [1, 2.5, True, np.float32(0.25), 3 + 1j],
        "key": jax.random.key(42),
        "empty": {},
    }
    prefix = tpj.write(tmp_path / "ckpt", tree)
    target = jax.tree.map(lambda x: x, tree)
    target["state"] = TrainState(params=jax.tree.map(jnp.zeros_like, tree["state"].params),
                                 step=jnp.asarray(0))
    target["pair"] = Pair(jnp.zeros((2, 2), jnp.int8), (np.zeros(3, np.int16), None))
    target["scalars"] = [0, 0.0, False, np.float32(0), 0j]
    target["key"] = jax.random.key(0)
    restored = tpj.restore(prefix, target)
    assert isinstance(restored["state"], TrainState) and isinstance(restored["pair"], Pair)
    _same({k: v for k, v in restored.items() if k != "key"},
          {k: v for k, v in tree.items() if k != "key"})
    assert restored["scalars"][0] == 1 and type(restored["scalars"][2]) is bool
    assert (jax.random.key_data(restored["key"]) == jax.random.key_data(tree["key"])).all()
    assert jnp.zeros(()).sharding == restored["state"].step.sharding


def test_single_array_tree_is_the_root_value(tmp_path):
    prefix = tpj.write(tmp_path / "ckpt", jnp.arange(3, dtype=jnp.int32))
    assert _keys(prefix) == [VALUE]
    restored = tpj.restore(prefix, jax.ShapeDtypeStruct((3,), jnp.int32))
    np.testing.assert_array_equal(np.asarray(restored), [0, 1, 2])


def test_deep_copied_checkpoint_writes_the_same_keys(tmp_path):
    import copy

    ckpt = Checkpoint(params=_params(), step=jnp.asarray(1))
    a = ckpt.write(str(tmp_path / "a"))
    b = copy.deepcopy(ckpt).write(str(tmp_path / "b"))
    assert _keys(a) == _keys(b)


def test_restore_into_abstract_target(tmp_path):
    tree = {"w": jnp.arange(4.0), "b": jnp.ones((), jnp.bfloat16)}
    prefix = tpj.write(tmp_path / "ckpt", tree)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    _same(tpj.restore(prefix, abstract), tree)
    key = jax.random.key(0)
    prefix = tpj.write(tmp_path / "key", {"k": key})
    restored = tpj.restore(prefix, {"k": jax.ShapeDtypeStruct(key.shape, key.dtype)})
    assert (jax.random.key_data(restored["k"]) == jax.random.key_data(key)).all()


def test_checkpoint_save_restores_from_directory_ignoring_save_counter(tmp_path):
    params = _params()
    ckpt = Checkpoint(params=params, step=jnp.asarray(1))
    ckpt.save(str(tmp_path / "ckpt"))
    later = jax.tree.map(lambda x: x + 1, params)
    ckpt.params, ckpt.step = later, jnp.asarray(2)  # JAX values are rebound, not mutated
    ckpt.save(str(tmp_path / "ckpt"))
    restored = tpj.restore(tmp_path, {"params": params, "step": jnp.asarray(0)})  # latest: -2
    _same(restored, {"params": later, "step": jnp.asarray(2)})


def test_shape_and_dtype_mismatches_name_path_and_key(tmp_path):
    prefix = tpj.write(tmp_path / "ckpt", {"params": _params()})
    target = {"params": _params()}
    target["params"]["dense"]["w"] = jnp.zeros((3, 2))
    target["params"]["dense"]["b"] = jnp.zeros(3, jnp.float16)
    with pytest.raises(InvalidArgumentError) as info:
        tpj.restore(prefix, target)
    message = str(info.value)
    assert "2 leaves differ" in message
    assert "['params']['dense']['w'] (params/dense/w/.ATTRIBUTES/VARIABLE_VALUE)" in message
    assert "float32[2, 3], the target is float32[3, 2]" in message
    assert "float32[3], the target is float16[3]" in message


def test_missing_and_extra_leaves_are_listed_or_allowed_with_partial(tmp_path):
    params = _params()
    prefix = tpj.write(tmp_path / "ckpt", {"params": params, "extra": jnp.ones(2)})
    target = {"params": {**params, "head": jnp.full(2, 9.0)}}
    with pytest.raises(InvalidArgumentError) as info:
        tpj.restore(prefix, target)
    message = str(info.value)
    assert "1 target leaves are not in the checkpoint: ['params']['head'] " \
           "(params/head/.ATTRIBUTES/VARIABLE_VALUE)" in message
    assert "1 checkpoint values are not in the target: extra/.ATTRIBUTES/VARIABLE_VALUE" \
        in message
    restored = tpj.restore(prefix, target, partial=True)
    _same(restored["params"]["dense"], params["dense"])
    assert restored["params"]["head"] is target["params"]["head"]  # kept as given
    abstract = {"params": {"head": jax.ShapeDtypeStruct((2,), jnp.float32)}}
    with pytest.raises(InvalidArgumentError, match=r"abstract target.*\['params'\]\['head'\]"):
        tpj.restore(prefix, abstract, partial=True)


def test_checkpoint_read_refuses_jax_leaves_and_points_to_restore(tmp_path):
    params = _params()
    ckpt = Checkpoint(params=params)
    prefix = ckpt.write(str(tmp_path / "ckpt"))
    with pytest.raises(FailedPreconditionError, match=r"tp\.jax\.restore"):
        ckpt.read(prefix)


def test_missing_checkpoint_is_not_found(tmp_path):
    from trackpoint.errors import NotFoundError

    with pytest.raises(NotFoundError, match="Failed to find any matching files"):
        tpj.restore(tmp_path / "nope", {"x": jnp.ones(2)})


# -- dtypes, host snapshot ------------------------------------------------------------------

DTYPES = [
    "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e4m3b11fnuz", "int4", "uint4", "int2", "uint2", "float4_e2m1fn",
    "int8", "uint32", "bool",
]


def test_narrow_dtypes_round_trip_bit_exact(tmp_path):
    tree = {name: (jnp.arange(12).reshape(3, 4) % 2).astype(getattr(jnp, name))
            if name in ("int2", "uint2", "bool")
            else jnp.arange(12).reshape(3, 4).astype(getattr(jnp, name))
            for name in DTYPES}
    prefix = tpj.write(tmp_path / "ckpt", tree)
    restored = tpj.restore(prefix, jax.tree.map(jnp.zeros_like, tree))
    _same(restored, tree)


def test_snapshot_to_host_gives_numpy_copies_of_every_array():
    tree = {"params": _params(), "step": 4, "key": jax.random.key(1)}
    host = tpj.snapshot_to_host(tree)
    assert isinstance(host["params"]["dense"]["w"], np.ndarray)
    assert host["step"] == 4
    assert host["key"].dtype == np.uint32
    np.testing.assert_array_equal(host["params"]["blocks"][0]["scale"],
                                  np.asarray(tree["params"]["blocks"][0]["scale"]))


# -- TensorFlow interoperability ------------------------------------------------------------


def test_tensorflow_reads_what_jax_wrote(tmp_path, tf):
    params = _params()
    tree = {"params": params, "opt_state": optax.adam(1e-3).init(params),
            "f8": jnp.linspace(-2, 2, 8).astype(jnp.float8_e4m3fn)}
    prefix = tpj.write(tmp_path / "ckpt", tree)
    reader = tf.train.load_checkpoint(prefix)
    for names, _, leaf in leaves_with_names(tree)[0]:
        got = reader.get_tensor("/".join(names) + VALUE)
        assert got.dtype == np.asarray(leaf).dtype
        assert got.tobytes() == np.asarray(leaf).tobytes()


def test_jax_restores_what_tensorflow_wrote(tmp_path, tf):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    tf_ckpt = tf.train.Checkpoint(params={"dense": {"w": tf.Variable(w)}},
                                  step=tf.Variable(9, dtype=tf.int64))
    tf_ckpt.save(str(tmp_path / "tf"))
    target = {"params": {"dense": {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)}},
              "step": np.int64(0)}
    restored = tpj.restore(tmp_path, target)
    np.testing.assert_array_equal(np.asarray(restored["params"]["dense"]["w"]), w)
    assert restored["step"] == 9 and isinstance(restored["step"], np.int64)


# -- activation -----------------------------------------------------------------------------


def test_import_trackpoint_imports_no_jax_and_activates_it_lazily(tmp_path):
    code = f"""
import sys
import trackpoint
from trackpoint.checkpoint.checkpoint import Checkpoint
Checkpoint(a={{"w": __import__("numpy").zeros(2)}}).write({str(tmp_path / "np")!r})
assert "jax" not in sys.modules, "import trackpoint imported jax"
import jax.numpy as jnp
params = {{"dense": {{"w": jnp.ones(2)}}}}
Checkpoint(params=params).write({str(tmp_path / "jax")!r})
assert type(params["dense"]) is dict
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert _keys(str(tmp_path / "jax")) == [f"params/dense/w{VALUE}"]
