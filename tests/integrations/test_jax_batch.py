"""Issue 28: JAX leaves through the batch-first protocol — restore builds every leaf of a batch
(single-device leaves placed in one pass), save serializes many leaves at once, each leaf is
checked once, and an unchanged entry keeps its trackable between saves."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import trackpoint as tp  # noqa: E402
import trackpoint.integrations.jax as tpj  # noqa: E402
from trackpoint.errors import (  # noqa: E402
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from trackpoint.integrations import jax_placement  # noqa: E402
from trackpoint.integrations.jax_arrays import ArrayLeaf, ScalarLeaf  # noqa: E402
from trackpoint.integrations.jax_leaf_targets import LeafSpec, LeafTarget  # noqa: E402
from trackpoint.integrations.jax_pytrees import PyTreeNode, leaves_with_names  # noqa: E402
from trackpoint.management.reader import CheckpointReader  # noqa: E402
from trackpoint.saving import restore as engine  # noqa: E402
from trackpoint.storage import MemoryStorage  # noqa: E402
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, batch_hook  # noqa: E402
from trackpoint.tracking.value_columns import ValueColumns  # noqa: E402

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _never(index: int, exc: InvalidArgumentError) -> BaseException:
    raise AssertionError(f"object {index} refused its value: {exc}")


def _targets(results: list[Any]) -> tuple[list[LeafTarget], list[dict[str, Any]], list[Any]]:
    """Leaf targets of every kind, the values the engine would hand them, and the expected."""
    key = jax.random.key(7)
    stored_key = np.asarray(jax.random.key_data(key))
    cases: list[tuple[Any, np.ndarray, dict[str, Any]]] = [
        (jnp.zeros((2, 3)), np.arange(6.0, dtype=np.float32).reshape(2, 3), {}),
        (jax.ShapeDtypeStruct((4,), jnp.bfloat16), np.arange(4).astype(jnp.bfloat16), {}),
        (jnp.asarray(0.0), np.array(0.25, np.float32), {"weak_type": True}),
        (jnp.zeros((), jnp.int32), np.array(-3, np.int32), {}),
        (np.zeros(2, np.int64), np.array([5, 6], np.int64), {}),
        (1.5, np.array(2.5), {}),
        (key, stored_key, {"prng_impl": str(jax.random.key_impl(key))}),
    ]
    targets, restored = [], []
    for position, (target, stored, extra) in enumerate(cases):
        spec = LeafSpec(position, (position,), target, f"k{position}", **extra)
        targets.append(LeafTarget(spec, tuple(stored.shape), results))
        restored.append({VARIABLE_VALUE_KEY: stored})
    return targets, restored, [stored for _, stored, _ in cases]


def _check_built(results: list[Any], stored: list[Any]) -> None:
    for value, expected in zip(results[:4], stored[:4]):
        assert isinstance(value, jax.Array) and value.committed
        assert value.dtype == expected.dtype and value.shape == expected.shape
        np.testing.assert_array_equal(np.asarray(value), expected)
        assert value.sharding == jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    assert results[2].weak_type and not results[0].weak_type and not results[3].weak_type
    assert isinstance(results[4], np.ndarray) and results[4].tolist() == [5, 6]
    assert type(results[5]) is float and results[5] == 2.5
    assert jax.dtypes.issubdtype(results[6].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(results[6]), stored[6])


def test_leaf_targets_batch_builds_every_leaf_then_stores_them_all() -> None:
    results: list[Any] = [None] * 7
    targets, restored, stored = _targets(results)
    prepare = batch_hook(LeafTarget, "_prepare_restores")
    assert prepare.__func__ is LeafTarget._prepare_restores.__func__  # its own batch form
    apply = prepare(targets, restored, _never)
    assert results == [None] * 7  # built, not stored: nothing of the result changes yet
    apply()
    _check_built(results, stored)


def test_restored_leaves_own_their_memory() -> None:
    # The engine hands views of the mapped checkpoint file, closed after the restore: a leaf
    # must never alias the bytes it was built from.
    results: list[Any] = [None] * 7
    targets, restored, stored = _targets(results)
    host = [np.array(r[VARIABLE_VALUE_KEY], copy=True) for r in restored]
    batch_hook(LeafTarget, "_prepare_restores")(
        targets, [{VARIABLE_VALUE_KEY: h} for h in host], _never
    )()
    for array in host[:5]:
        array[...] = 0
    _check_built(results, stored)


def test_an_aligned_host_buffer_is_copied_not_aliased() -> None:
    # The CPU runtime may adopt a 64-byte-aligned host buffer as the device buffer itself.
    buffer = np.zeros(4096 + 16, np.float32)
    start = (-buffer.ctypes.data % 64) // buffer.itemsize
    stored = buffer[start : start + 4096].reshape(64, 64)
    stored[...] = 1.0
    results: list[Any] = [None]
    spec = LeafSpec(0, (0,), jax.ShapeDtypeStruct((64, 64), jnp.float32), "k")
    target = LeafTarget(spec, (64, 64), results)
    batch_hook(LeafTarget, "_prepare_restores")([target], [{VARIABLE_VALUE_KEY: stored}], _never)()
    stored[...] = 0.0  # the mapped file's pages, reused after the restore
    assert float(np.asarray(results[0]).min()) == 1.0


def test_placement_without_the_runtime_transfer_gives_the_same_leaves(monkeypatch) -> None:
    # A JAX without the internal transfer (or one refusing a call) places through
    # jax.device_put, with the same results (weak types included).
    monkeypatch.setattr(jax_placement, "_runtime", [None])
    results: list[Any] = [None] * 7
    targets, restored, stored = _targets(results)
    batch_hook(LeafTarget, "_prepare_restores")(targets, restored, _never)()
    _check_built(results, stored)


def test_a_refused_transfer_falls_back_for_the_whole_batch(monkeypatch) -> None:
    results: list[Any] = [None] * 7
    targets, restored, stored = _targets(results)  # placements made with the runtime's form
    calls: list[int] = []

    def refuse(*args: Any) -> Any:
        calls.append(1)
        raise TypeError("incompatible function arguments")

    runtime = jax_placement._runtime[0]
    assert runtime is not None  # this JAX has it: the fast path is what is tested elsewhere
    monkeypatch.setattr(jax_placement, "_runtime", [(refuse, runtime[1])])
    batch_hook(LeafTarget, "_prepare_restores")(targets, restored, _never)()
    _check_built(results, stored)
    assert calls == [1] and jax_placement._runtime == [None]  # asked once, then never again


def test_public_restore_of_a_large_tree_matches_the_saved_one(tmp_path) -> None:
    rng = np.random.default_rng(0)
    tree = {
        "layers": [
            {"w": jnp.asarray(rng.standard_normal((4, 3), np.float32)), "b": jnp.zeros(3)}
            for _ in range(150)
        ],
        "lr": jnp.asarray(1e-3),  # weakly typed
        "step": 12,
    }
    path = tpj.write(tmp_path / "ckpt", tree)
    target = {**jax.tree_util.tree_map(jnp.zeros_like, tree), "step": 0}
    restored = tpj.restore(path, target)
    assert restored["step"] == 12 and restored["lr"].weak_type
    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(tree)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    abstract = jax.eval_shape(lambda: tree)
    again = tpj.restore(path, {**abstract, "step": 0})
    np.testing.assert_array_equal(again["layers"][149]["w"], tree["layers"][149]["w"])


def test_array_leaves_serialize_many_as_each_alone() -> None:
    arrays = [jnp.arange(3.0), jnp.asarray(2.0), jax.random.key(1), jnp.ones((2, 2), jnp.int8)]
    leaves = [ArrayLeaf(a) for a in arrays]
    assert "_serialize_many" in vars(ArrayLeaf)  # its own batch form, not the default's map
    many = batch_hook(ArrayLeaf, "_serialize_many")(leaves)
    assert batch_hook(ArrayLeaf, "_whole_value_names") is None  # slices, metadata: not whole
    for values, leaf in zip(many, leaves):
        alone = leaf._serialize_to_tensors()
        assert list(values) == list(alone)
        for name, value in values.items():
            got = np.asarray(value() if callable(value) else value)
            want = np.asarray(alone[name]() if callable(alone[name]) else alone[name])
            assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert [sorted(v) for v in many] == [
        [VARIABLE_VALUE_KEY], [VARIABLE_VALUE_KEY, "jax_metadata"],
        [VARIABLE_VALUE_KEY, "jax_metadata"], [VARIABLE_VALUE_KEY],
    ]  # fmt: skip
    arrays[0].delete()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        batch_hook(ArrayLeaf, "_serialize_many")(leaves)


def test_scalar_leaves_declare_their_one_whole_value() -> None:
    leaves = [ScalarLeaf(3), ScalarLeaf(np.float32(0.5))]
    assert batch_hook(ScalarLeaf, "_whole_value_names") == (VARIABLE_VALUE_KEY,)
    many = batch_hook(ScalarLeaf, "_serialize_many")(leaves)
    assert [sorted(v) for v in many] == [[VARIABLE_VALUE_KEY]] * 2
    assert many[0][VARIABLE_VALUE_KEY].dtype == np.int64
    assert many[1][VARIABLE_VALUE_KEY].dtype == np.float32


def test_an_unchanged_entry_keeps_its_trackable_and_a_rebound_one_gets_a_new_one() -> None:
    state = {"w": jnp.zeros(2), "v": np.zeros(2), "s": 3, "nested": {"b": jnp.ones(1)}}
    node = PyTreeNode(state)
    first = node._trackable_children()
    second = node._trackable_children()
    assert all(second[name] is first[name] for name in first)
    state["w"] = jnp.ones(2)  # the JAX step: rebound
    third = node._trackable_children()
    assert third["w"] is not first["w"] and third["w"].array is state["w"]  # type: ignore[attr-defined]
    assert all(third[name] is first[name] for name in ("v", "s", "nested"))


def test_a_rebound_entry_is_checked_and_named() -> None:
    state = {"w": jnp.zeros(2)}
    ckpt = tp.Checkpoint(state=state)
    state["w"] = jnp.zeros(2, jnp.float8_e3m4)  # no TF DataType
    with pytest.raises(InvalidArgumentError, match=r"\['w'\].*float8_e3m4"):
        ckpt.write("/nonexistent/never-written")


def test_keys_colliding_inside_the_tree_are_refused() -> None:
    tree = OrderedDict([(1, {"x": jnp.ones(2)}), ("1", {"y": jnp.zeros(2)})])
    with pytest.raises(InvalidArgumentError, match=r"\[1\] and \['1'\] get the same.*'1'"):
        leaves_with_names(tree)


def test_dict_children_follow_jax_order_and_empty_containers_are_left_out(tmp_path) -> None:
    tree = {"z": jnp.ones(1), "a": {"m": jnp.zeros(1), "e": {}}, "n": [None, {}], "b": ()}
    path = tpj.write(tmp_path / "ckpt", tree)
    with CheckpointReader(path) as reader:
        proto = reader.object_graph()
    assert proto is not None
    assert [c.local_name for c in proto.nodes[0].children] == ["a", "z"]
    names = [names for names, _, _ in leaves_with_names(tree)[0]]
    assert names == [("a", "m"), ("z",)]  # jax's flattening order, as the graph's
    assert sorted(k for k, _ in tp.list_variables(path) if not k.startswith("_")) == [
        "a/m" + VALUE, "z" + VALUE,
    ]  # fmt: skip


def test_trackables_in_a_tree_stay_leaves(tmp_path) -> None:
    variable = tp.Variable(np.arange(3.0))
    tree = {"w": jnp.ones(2), "v": variable}
    node = PyTreeNode(tree)
    assert node._trackable_children()["v"] is variable
    assert isinstance(node._trackable_children()["w"], Trackable)


def test_restore_prepares_the_leaves_read_whole_as_one_batch(tmp_path, monkeypatch) -> None:
    tree = {"layers": [{"w": jnp.full((2, 2), float(i)), "n": i} for i in range(40)]}
    path = tpj.write(tmp_path / "ckpt", tree)
    calls: list[tuple[int, type]] = []

    def hook(cls, name):  # the engine's look-up of a class's batch form, recorded for leaves
        found = batch_hook(cls, name)
        if cls is not LeafTarget:
            return found

        def spy(trackables, restored, on_error):
            calls.append((len(trackables), type(restored)))
            return found(trackables, restored, on_error)

        return spy

    monkeypatch.setattr(engine, "batch_hook", hook)
    restored = tpj.restore(path, {"layers": [{"w": jnp.zeros((2, 2)), "n": 0}] * 40})
    # One call for all 80 leaves, their values as one column (no dict per leaf).
    assert calls == [(80, ValueColumns)]
    assert [layer["n"] for layer in restored["layers"]] == list(range(40))
    np.testing.assert_array_equal(restored["layers"][39]["w"], np.full((2, 2), 39.0))
    calls.clear()
    saved = tpj.restore(path)  # without a target: the same one batch
    assert calls == [(80, ValueColumns)]
    np.testing.assert_array_equal(saved["layers"][7]["w"], np.full((2, 2), 7.0))


def test_restore_reads_through_the_storage_of_its_options() -> None:
    storage = MemoryStorage()
    options = tp.CheckpointOptions(storage=storage)
    tree = {"w": jnp.arange(3.0), "step": 5}
    tpj.write("mem/run/ckpt", tree, options=options)
    assert storage.exists("mem/run/ckpt.index")
    restored = tpj.restore("mem/run/ckpt", {"w": jnp.zeros(3), "step": 0}, options=options)
    assert restored["step"] == 5
    np.testing.assert_array_equal(restored["w"], np.arange(3.0))
    saved = tpj.restore("mem/run/ckpt", options=options)  # without a target too
    np.testing.assert_array_equal(saved["w"], np.arange(3.0))
    with pytest.raises(NotFoundError, match="mem/run/ckpt"):
        tpj.restore("mem/run/ckpt", {"w": jnp.zeros(3), "step": 0})  # not on the local disk
