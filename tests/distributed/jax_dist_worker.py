"""One process of a multi-process JAX job (``jax.distributed`` on loopback, 2 CPU devices each).

Usage: ``jax_dist_worker.py <scenario> <workdir> <port> <num_processes> <process_id>``.
Each process writes ``<workdir>/result-<scenario>-<process_id>.json`` (what it checked, or the
error it raised) and exits without JAX's shutdown barrier when a peer is dead.

Scenarios (run by tests/distributed/test_jax_processes.py):

* ``save``: global arrays of several shardings (rows, a 2-D grid, a block replicated across
  processes, fully replicated), a Flax NNX model whose parameters are sharded over every device
  and its optax optimizer after one step, saved twice through ``tp.CheckpointManager`` on a
  ``DistributedCheckpoint`` (the second save asynchronous); the full values of the second save
  are written to ``expected.npz``; then restored on the same processes into other shardings.
* ``restore``: ``tp.jax.restore`` of the latest checkpoint into shardings over this job's
  devices (any process count), compared with ``expected.npz``, shard by shard.
* ``kill``: a first save succeeds; in the second, process ``KILL_PROCESS`` kills itself once
  its shard is written, and the others must fail with a ``CollectiveError``.
* ``no-torch``: torch cannot be imported (as where it is not installed); global arrays and a
  numpy ``Slice`` are saved and restored through ``DistributedCheckpoint``.
* ``rebind`` (issue 27 finding 11): attributes of the ``DistributedCheckpoint`` rebound between
  saves (``ckpt.params = new_params``, docs/jax.md's pattern; sync and async); each process
  reads back what every save wrote.
* ``differ`` (finding 12): values every process holds whole (a Python int in a dict, a
  ``PythonState``, a numpy array, a fully replicated jax array) that
  differ between the processes make the save fail on every process, naming the key; nothing is
  committed; a per-process value as each process's slice of a tensor sharded by process is
  saved and restored per process.

Timeouts come from jobs.py (sized for a loaded machine; the kill scenario's is its subject).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if sys.argv[1:2] == ["no-torch"]:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` now fails
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jobs  # noqa: E402
import numpy as np  # noqa: E402

KILL_PROCESS = 2
SHAPES = {"rows": (16, 4), "grid": (8, 8), "block": (8, 4), "whole": (4, 5)}


def full_value(name: str, shape: tuple[int, ...], version: int) -> np.ndarray:
    seed = sum(map(ord, name))
    n = int(np.prod(shape))
    return (np.cos(np.arange(n, dtype=np.float32) * 0.37 + seed) + version).reshape(shape)


def mesh2d() -> jax.sharding.Mesh:
    """(processes, 2) mesh: one row of devices per process."""
    devices = np.array(jax.devices()).reshape(jax.process_count(), -1)
    return jax.sharding.Mesh(devices, ("p", "d"))


def sharding(spec: tuple[Any, ...]) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh2d(), jax.sharding.PartitionSpec(*spec))


def save_specs() -> dict[str, tuple[Any, ...]]:
    return {
        "rows": (("p", "d"), None),  # rows over every device
        "grid": ("p", "d"),  # a 2-D grid
        "block": (None, "d"),  # columns over d, replicated across processes
        "whole": (),  # fully replicated
    }


def restore_specs() -> dict[str, tuple[Any, ...]]:
    return {
        "rows": (None, "d"),
        "grid": ("d", "p"),
        "block": (("p", "d"), None),
        "whole": ("p", None),
    }


def global_array(value: np.ndarray, spec: tuple[Any, ...]) -> jax.Array:
    return jax.make_array_from_callback(value.shape, sharding(spec), lambda idx: value[idx])


def arrays(version: int) -> dict[str, jax.Array]:
    specs = save_specs()
    return {
        name: global_array(full_value(name, shape, version), specs[name])
        for name, shape in SHAPES.items()
    }


# -- a Flax NNX model, sharded over every device -----------------------------------------------


def make_model() -> Any:
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.l1 = nnx.Linear(4, 8, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.l2(jax.nn.relu(self.l1(x)))

    return Model(nnx.Rngs(params=0, dropout=1))


def param_spec(shape: tuple[int, ...], restore: bool) -> tuple[Any, ...]:
    """Parameters: the last axis over every device, or on restore the first axis (replicated
    where the axis does not divide)."""
    devices = len(jax.devices())
    if not shape:
        return ()
    if restore:
        return (("p", "d"),) + (None,) * (len(shape) - 1) if shape[0] % devices == 0 else ()
    return (None,) * (len(shape) - 1) + (("p", "d"),) if shape[-1] % devices == 0 else ()


def trained_model() -> tuple[Any, Any]:
    """The model with sharded parameters, and an Adam optimizer after one step."""
    import optax
    from flax import nnx

    model = make_model()
    state = nnx.state(model, nnx.Param)
    sharded = jax.tree.map(
        lambda x: global_array(np.asarray(x), param_spec(x.shape, restore=False)), state
    )
    nnx.update(model, sharded)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = global_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), ())

    @nnx.jit
    def step(model: Any, optimizer: Any, x: jax.Array) -> None:
        grads = nnx.grad(lambda m: (m(x) ** 2).mean())(model)
        optimizer.update(model, grads)

    step(model, optimizer, x)
    return model, optimizer


def gather_full(tree: Any) -> dict[str, np.ndarray]:
    """Every leaf's whole value, by key path (each process gets all of them)."""
    from jax.experimental import multihost_utils

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        out[jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def state_tree(version: int) -> dict[str, Any]:
    from flax import nnx

    model, optimizer = trained_model()
    return {
        "arrays": arrays(version),
        "model": nnx.state(model),
        "opt": nnx.state(optimizer),
        "meta": {"step": np.array(10 * version, dtype=np.int64)},
    }


def abstract_target() -> dict[str, Any]:
    """The restore target: abstract leaves on other shardings than the ones saved."""
    from flax import nnx

    specs = restore_specs()
    target_arrays = {
        name: jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding(specs[name]))
        for name, shape in SHAPES.items()
    }

    def build() -> tuple[Any, Any]:
        import optax

        model = make_model()
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    _, model_state, opt_state = None, *[nnx.state(x) for x in nnx.eval_shape(build)]

    def reshard(leaf: Any) -> Any:
        if (
            isinstance(leaf, jax.ShapeDtypeStruct)
            and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
            and leaf.shape
        ):
            spec = param_spec(leaf.shape, restore=True)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding(spec))
        return leaf

    return {
        "arrays": target_arrays,
        "model": jax.tree.map(reshard, model_state),
        "opt": jax.tree.map(reshard, opt_state),
        "meta": {"step": np.array(0, dtype=np.int64)},
    }


def compare(restored: Any, expected: dict[str, np.ndarray]) -> list[str]:
    """Compare every addressable shard of every leaf with the expected full value."""
    checked = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]:
        name = jax.tree_util.keystr(path)
        want = expected[name]
        if isinstance(leaf, jax.Array):
            data = (
                jax.random.key_data(leaf)
                if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
                else leaf
            )
            for shard in data.addressable_shards:
                np.testing.assert_array_equal(
                    np.asarray(shard.data), want[shard.index], err_msg=name
                )
        else:
            np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=name)
        checked.append(name)
    return checked


def check_restore(path: str, workdir: Path) -> dict[str, Any]:
    import trackpoint as tp

    expected = dict(np.load(workdir / "expected.npz"))
    target = abstract_target()
    restored = tp.jax.restore(path, target)
    checked = compare(restored, expected)
    rows = restored["arrays"]["rows"]
    return {
        "checked": len(checked),
        "rows_sharding": str(rows.sharding.spec),
        "rows_local_shards": len(rows.addressable_shards),
        "fully_addressable": bool(rows.is_fully_addressable),
    }


# -- scenarios -----------------------------------------------------------------------------------


def scenario_save(workdir: Path) -> dict[str, Any]:
    import trackpoint as tp
    import trackpoint.distributed as tpd

    result: dict[str, Any] = {}
    tree = state_tree(1)
    # A plain Checkpoint of a global array would hold one process's part: refused.
    try:
        tp.Checkpoint(arrays=tree["arrays"]).write(str(workdir / "alone" / "ckpt"))
        result["alone"] = "written"
    except tp.errors.InvalidArgumentError as exc:
        result["alone"] = str(exc)

    ckpt = tpd.DistributedCheckpoint(**tree, timeout=jobs.collective_timeout())
    result["collective"] = type(ckpt.collective).__name__
    manager = tp.CheckpointManager(ckpt, str(workdir / "ckpts"), max_to_keep=2)
    result["first"] = manager.save()
    tree2 = state_tree(2)
    for name, value in tree2.items():  # rebind the new values (JAX updates make new trees)
        setattr(ckpt.checkpoint, name, value)
    expected = gather_full(tree2)
    if jax.process_index() == 0:
        np.savez(workdir / "expected.npz", **expected)
    result["second"] = manager.save(options=tp.CheckpointOptions(enable_async=True))
    manager.sync()
    result["latest"] = manager.latest_checkpoint
    result["checkpoints"] = list(manager.checkpoints)
    ckpt.close()
    # Every process restores the checkpoint into other shardings.
    result["restore"] = check_restore(str(workdir / "ckpts"), workdir)
    return result


def scenario_restore(workdir: Path) -> dict[str, Any]:
    return check_restore(str(workdir / "ckpts"), workdir)


def scenario_kill(workdir: Path) -> dict[str, Any]:
    import trackpoint as tp
    import trackpoint.distributed as tpd

    me = jax.process_index()
    ckpt = tpd.DistributedCheckpoint(
        arrays=arrays(1), backend="jax", timeout=jobs.KILL_COLLECTIVE_SECONDS
    )
    manager = tp.CheckpointManager(ckpt, str(workdir / "ckpts"), max_to_keep=3)
    first = manager.save()
    ckpt.checkpoint.arrays = arrays(2)

    def progress(event: Any) -> None:
        if event.phase == "write" and me == KILL_PROCESS:
            os.kill(os.getpid(), signal.SIGKILL)  # dies with its shard written, unreported

    began = time.monotonic()
    try:
        manager.save(options=tp.CheckpointOptions(progress=progress))
        return {"first": first, "second": "committed"}
    except Exception as exc:
        return {
            "first": first,
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - began,
        }


def scenario_no_torch(workdir: Path) -> dict[str, Any]:
    import trackpoint as tp
    import trackpoint.distributed as tpd

    result: dict[str, Any] = {}
    try:
        result["torch_name"] = repr(tpd.TorchCollective)
    except ImportError as exc:
        result["torch_name"] = str(exc)
    me, count = jax.process_index(), jax.process_count()
    full = np.arange(2 * count * 3, dtype=np.float32).reshape(2 * count, 3)
    mine = full[2 * me : 2 * me + 2].copy()
    ckpt = tpd.DistributedCheckpoint(
        arrays=arrays(1), table=tpd.Slice(mine, full.shape, (2 * me, 0)),
        timeout=jobs.collective_timeout(),
    )
    result["collective"] = type(ckpt.collective).__name__
    path = ckpt.save(str(workdir / "ckpts" / "ckpt"))
    # Another split of the table: each process restores the rows of the next one.
    other = (me + 1) % count
    table = np.zeros((2, 3), np.float32)
    back = tpd.DistributedCheckpoint(table=tpd.Slice(table, full.shape, (2 * other, 0)))
    back.read(path).expect_partial()
    result["table"] = bool(np.array_equal(table, full[2 * other : 2 * other + 2]))
    specs = restore_specs()
    target = {
        "arrays": {
            name: jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding(specs[name]))
            for name, shape in SHAPES.items()
        }
    }
    restored = tp.jax.restore(path, target, partial=True)
    expected = {f"['arrays']['{name}']": full_value(name, shape, 1)
                for name, shape in SHAPES.items()}
    result["checked"] = compare(restored, expected)  # raises on a mismatch
    result["loaded"] = sorted(
        name for name, module in sys.modules.items()
        if module is not None
        and name.split(".")[0] in ("torch", "trackpoint")
        and "torch" in name
    )
    return result


def _saved(path: str, key: str) -> list[Any]:
    import trackpoint as tp

    return np.asarray(tp.load_variable(path, key + "/.ATTRIBUTES/VARIABLE_VALUE")).tolist()


def scenario_rebind(workdir: Path) -> dict[str, Any]:
    """Rebinding ``ckpt.params``/``ckpt.step`` between saves; the values each save wrote."""
    import jax.numpy as jnp

    import trackpoint as tp
    import trackpoint.distributed as tpd

    specs = save_specs()
    rows = {"w": global_array(full_value("rows", SHAPES["rows"], 0), specs["rows"])}
    ckpt = tpd.DistributedCheckpoint(
        params=rows, step=jnp.asarray(0), timeout=jobs.collective_timeout()
    )
    directory = workdir / "ckpts"
    paths = [ckpt.save(str(directory / "ckpt"))]
    for version in (1, 2):  # a training step makes new trees: rebind them
        ckpt.params = {"w": global_array(full_value("rows", SHAPES["rows"], version),
                                         specs["rows"])}  # fmt: skip
        ckpt.step = jnp.asarray(version)
        options = tp.CheckpointOptions(enable_async=version == 2)
        paths.append(ckpt.save(str(directory / "ckpt"), options))
    ckpt.params = {"w": global_array(full_value("rows", SHAPES["rows"], 9), specs["rows"])}
    ckpt.sync()  # rebound after the async call: not in its checkpoint
    ckpt.close()
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("saved")
    return {
        "paths": paths,
        "steps": [_saved(p, "step") for p in paths],
        "w_equals_version": [
            next((v for v in range(10) if _saved(p, "params/w")
                  == full_value("rows", SHAPES["rows"], v).tolist()), None)
            for p in paths
        ],  # fmt: skip
        "wrapper_reads_the_wrapped": ckpt.checkpoint.params is ckpt.params,
    }


def scenario_differ(workdir: Path) -> dict[str, Any]:
    """Values every process holds whole, differing between processes: each save must fail."""
    import json as json_module

    import trackpoint as tp
    import trackpoint.distributed as tpd

    me, count = jax.process_index(), jax.process_count()

    class Loader(tp.PythonState):
        def __init__(self, pos: int) -> None:
            self.pos = pos

        def serialize(self) -> bytes:
            return json_module.dumps({"pos": self.pos}).encode()

        def deserialize(self, data: bytes) -> None:
            self.pos = json_module.loads(data)["pos"]

    def per_process(value: np.ndarray) -> jax.Array:  # "replicated", but each its own data
        return jax.make_array_from_callback(value.shape, sharding(()), lambda idx: value[idx])

    ones = np.ones((4, 5), np.float32)
    cases = {
        "python-int": {"loader": {"pos": 100 + me}},
        "python-state": {"loader": Loader(100 + me)},
        "numpy": {"w": np.arange(3.0) + me},
        "jax-replicated": {"w": per_process(ones + me)},
    }
    errors: dict[str, Any] = {}
    for name, objects in cases.items():
        directory = workdir / name
        ckpt = tpd.DistributedCheckpoint(
            **objects, same=np.ones(2), timeout=jobs.collective_timeout()
        )
        try:
            ckpt.save(str(directory / "ckpt"))
            errors[name] = None
        except tp.errors.CheckpointError as exc:
            errors[name] = {"type": type(exc).__name__, "message": str(exc),
                            "latest": tp.latest_checkpoint(str(directory))}  # fmt: skip
        ckpt.close()
    # Equal everywhere: saved. Per-process state as each process's slice: saved per process.
    pos = np.array([100 + me], np.int64)
    ckpt = tpd.DistributedCheckpoint(
        loader={"pos": 7}, w=per_process(ones), pos=tpd.Slice(pos, (count,), (me,)),
        timeout=jobs.collective_timeout(),
    )
    path = ckpt.save(str(workdir / "equal" / "ckpt"))
    ckpt.close()
    back = np.zeros(1, np.int64)
    loader: dict[str, Any] = {"pos": 0}
    restored = tpd.DistributedCheckpoint(
        loader=loader, pos=tpd.Slice(back, (count,), (me,)), timeout=jobs.collective_timeout()
    )
    restored.read(path).expect_partial()
    restored.close()
    # The JAX way: tp.jax.restore reads the whole (processes,) tensor; each takes its row.
    rows = tp.jax.restore(path, {"pos": np.zeros(count, np.int64)}, partial=True)["pos"]
    return {
        "errors": errors,
        "saved_pos": _saved(path, "pos"),
        "restored_pos": int(back[0]),
        "jax_restored_pos": int(rows[me]),
        "restored_loader": loader["pos"],
    }


def main() -> None:
    scenario, workdir, port, count, index = sys.argv[1:6]
    workdir_path = Path(workdir)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        initialization_timeout=int(jobs.init_timeout()),
        # Above the kill scenario's collective timeout: trackpoint's error comes first.
        heartbeat_timeout_seconds=int(max(100, 5 * jobs.KILL_COLLECTIVE_SECONDS)),
    )
    out = workdir_path / f"result-{scenario}-{index}.json"
    try:
        result = {
            "scenario_save": scenario_save,
            "scenario_restore": scenario_restore,
            "scenario_kill": scenario_kill,
            "scenario_no-torch": scenario_no_torch,
            "scenario_rebind": scenario_rebind,
            "scenario_differ": scenario_differ,
        }[f"scenario_{scenario}"](workdir_path)
        result["ok"] = True
    except Exception as exc:
        result = {
            "ok": False,
            "error": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    out.write_text(json.dumps(result))
    if scenario == "kill":
        # A peer is dead: JAX's shutdown barrier would wait for it. Process 0 runs the
        # coordination service, so it stays until the other survivors have written results.
        if int(index) == 0:
            others = [
                workdir_path / f"result-kill-{i}.json"
                for i in range(1, int(count))
                if i != KILL_PROCESS
            ]
            deadline = time.monotonic() + jobs.KILL_COLLECTIVE_SECONDS * 3
            while time.monotonic() < deadline and not all(p.exists() for p in others):
                time.sleep(0.05)
        sys.stdout.flush()
        os._exit(0)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
