"""Subprocess worker for test_jax_sharding.py: sharded jax arrays on 8 simulated CPU devices.

``python jax_sharding_worker.py DIR`` runs every scenario and writes ``DIR/results.json``
(observations by scenario, checked by the test), plus ``DIR/sharded`` (a checkpoint of sharded
arrays) and ``DIR/expected.npz`` (their full values) for TensorFlow to read in the test process.
XLA_FLAGS must be set before jax initialises its backend, hence a separate process.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, SingleDeviceSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import trackpoint.integrations.jax as tpj  # noqa: E402
from trackpoint.bundle.data_files import DataFiles  # noqa: E402
from trackpoint.bundle.reader import BundleReader  # noqa: E402
from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402

FULL = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def placed_correctly(array: jax.Array, full: np.ndarray, sharding: Any) -> bool:
    """Right values, on exactly the target sharding, every shard holding its own box."""
    if array.sharding != sharding or not np.array_equal(np.asarray(array), full):
        return False
    expected = sharding.addressable_devices_indices_map(full.shape)
    return all(
        shard.device in expected and np.array_equal(np.asarray(shard.data), full[shard.index])
        for shard in array.addressable_shards
    )


def main(directory: Path) -> None:
    results: dict[str, Any] = {"devices": jax.device_count()}
    mesh42 = jax.make_mesh((4, 2), ("x", "y"))
    mesh24 = jax.make_mesh((2, 4), ("a", "b"))
    mesh8 = jax.make_mesh((8,), ("z",))
    tree = {
        "a": jax.device_put(FULL, NamedSharding(mesh42, P("x", "y"))),
        "b": jax.device_put(FULL.astype(jnp.bfloat16), NamedSharding(mesh42, P("x", None))),
        "r": jax.device_put(FULL, NamedSharding(mesh42, P())),
    }
    prefix = tpj.write(directory / "sharded", tree)
    np.savez(directory / "expected.npz", **{k: np.asarray(v) for k, v in tree.items()})
    results["dtypes"] = {k: str(v.dtype) for k, v in tree.items()}  # npz drops bfloat16

    # Stored layout: one slice per distinct shard, replicas written once.
    with BundleReader(prefix) as reader:
        results["slices"] = {k: [str(s) for s in reader.slices(f"{k}{VALUE}")] for k in tree}

    # Resharding into other meshes, replication, one device, abstract and concrete targets.
    targets = {
        "a_by_b_a": (FULL, NamedSharding(mesh24, P("b", "a")), jnp.float32),
        "b_by_cols": (FULL, NamedSharding(mesh24, P(None, "b")), jnp.bfloat16),
        "a_replicated": (FULL, NamedSharding(mesh8, P()), jnp.float32),
        "r_rows8": (FULL, NamedSharding(mesh8, P("z", None)), jnp.float32),
        "a_one_device": (FULL, SingleDeviceSharding(jax.devices()[5]), jnp.float32),
    }
    placed = {}
    for name, (full, sharding, dtype) in targets.items():
        key = name[0]
        abstract = jax.ShapeDtypeStruct(full.shape, dtype, sharding=sharding)
        concrete = jax.device_put(np.zeros(full.shape, dtype), sharding)
        for kind, target in (("abstract", abstract), ("concrete", concrete)):
            out = tpj.restore(prefix, {key: target}, partial=True)[key]
            placed[f"{name}/{kind}"] = placed_correctly(out, full.astype(dtype), sharding)
    results["placed"] = placed

    # Only the needed regions are read: each target box reads the stored slices it meets.
    calls: list[tuple[str, int]] = []
    read_slice = BundleReader.read_slice
    # Where every verb gets a stored tensor's (or slice's) bytes: read, or the checked
    # zero-copy view and the copy straight into a target (the many-small-values paths).
    read_stored, view_stored, copy_stored = DataFiles.read, DataFiles.view, DataFiles.copy_into
    views_stored = DataFiles.views

    def spy_read_slice(
        self: BundleReader, key: str, tensor_slice: Any, **kwargs: Any
    ) -> np.ndarray:
        calls.append(("read_slice", str(tensor_slice)))
        return read_slice(self, key, tensor_slice, **kwargs)

    def spy_read_stored(self: DataFiles, key: str, layout: Any) -> Any:
        calls.append(("entry", key))
        return read_stored(self, key, layout)

    def spy_view_stored(self: DataFiles, layout: Any) -> Any:
        calls.append(("entry", keys_by_offset.get((layout.shard_id, layout.offset), "?")))
        return view_stored(self, layout)

    def spy_copy_stored(self: DataFiles, layout: Any, out: Any) -> Any:
        calls.append(("entry", keys_by_offset.get((layout.shard_id, layout.offset), "?")))
        return copy_stored(self, layout, out)

    def spy_views_stored(self: DataFiles, keys: Any, layouts: Any) -> Any:
        calls.extend(("entry", key) for key in keys)
        return views_stored(self, keys, layouts)

    with BundleReader(prefix) as index:
        keys_by_offset = {
            (index.entry(k).shard_id, index.entry(k).offset): k for k in index.keys()
        }
    BundleReader.read_slice = spy_read_slice  # type: ignore[method-assign]
    DataFiles.read = spy_read_stored  # type: ignore[method-assign]
    DataFiles.view = spy_view_stored  # type: ignore[method-assign]
    DataFiles.copy_into = spy_copy_stored  # type: ignore[method-assign]
    DataFiles.views = spy_views_stored  # type: ignore[method-assign]
    try:
        rows8 = jax.ShapeDtypeStruct(
            (8, 12), jnp.float32, sharding=NamedSharding(mesh8, P("z", None))
        )
        tpj.restore(prefix, {"a": rows8}, partial=True)
        results["reads_sliced"] = calls[:]
        calls.clear()
        tpj.restore(prefix, {"r": rows8}, partial=True)
        results["reads_unsliced"] = calls[:]
    finally:
        BundleReader.read_slice = read_slice  # type: ignore[method-assign]
        DataFiles.read = read_stored  # type: ignore[method-assign]
        DataFiles.view = view_stored  # type: ignore[method-assign]
        DataFiles.copy_into = copy_stored  # type: ignore[method-assign]
        DataFiles.views = views_stored  # type: ignore[method-assign]

    # An optax state of sharded params through tp.Checkpoint, restored on another mesh.
    params = {"w": tree["a"], "b": jax.device_put(FULL[0], NamedSharding(mesh42, P("y")))}
    opt = optax.adam(0.1)
    opt_state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = opt.update(grads, opt_state, params)
    ckpt_prefix = Checkpoint(params=params, opt_state=opt_state).write(str(directory / "ckpt"))
    other = {"w": NamedSharding(mesh24, P(None, "a")), "b": NamedSharding(mesh24, P("b"))}
    target = {
        "params": {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=other[k])
                   for k, v in params.items()},
        "opt_state": opt.init({k: jax.device_put(jnp.zeros_like(v), other[k])
                               for k, v in params.items()}),
    }
    restored = tpj.restore(ckpt_prefix, target)
    saved = {"params": params, "opt_state": opt_state}
    results["checkpoint_optax"] = all(
        np.array_equal(np.asarray(x), np.asarray(y)) and x.sharding == t.sharding
        for x, y, t in zip(jax.tree.leaves(restored), jax.tree.leaves(saved),
                           jax.tree.leaves(target))
    )
    (directory / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
