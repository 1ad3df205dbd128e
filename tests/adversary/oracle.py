"""The differential save oracle: what a save wrote == what was reachable at the call.

The oracle never asks trackpoint what a checkpoint should hold. At the call it takes its own
deep copy of every reachable value through the frameworks' own APIs (``module.state_dict()``
and ``optimizer.state_dict()`` cloned, ``jax.tree_util`` leaves, numpy copies, plain values
deep-copied, a ``PythonState``'s ``serialize()``) and derives each value's checkpoint key from
the documented key grammar (TensorFlow's: ``<path>/.ATTRIBUTES/VARIABLE_VALUE``, ``.`` escaped
as ``..`` and ``/`` as ``.S``; optimizer slots under ``.OPTIMIZER_SLOT/<optimizer>/<slot>``;
a tracked container's plain entries as one JSON value at ``<path>/.ATTRIBUTES/py_state``).

Once the save is complete (after ``sync()`` for an async one) :func:`check_checkpoint` reads the
checkpoint back by key, through ``tp.load_checkpoint(...).get_tensor`` and optionally through
real TensorFlow's ``tf.train.load_checkpoint``, and compares bit for bit: same key set (nothing
missing, nothing stale), same dtype, shape and bytes (NaN payloads and -0.0 included), plain
values equal with their types (``True`` is not ``1``). A fresh set of live objects restored from
the checkpoint must then capture to the same values (:func:`assert_same`).

Also a script for the tests that need a process of their own: ``python oracle.py keras DIR``
(Keras picks its backend at import) and ``python oracle.py jax DIR PORT COUNT INDEX`` (one
process of a ``jax.distributed`` job).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "OBJECT_GRAPH_KEY",
    "SAVE_COUNTER_KEY",
    "Expected",
    "OracleMismatch",
    "assert_same",
    "builtin",
    "capture",
    "check_checkpoint",
    "escape",
    "host_copy",
    "is_plain",
    "read_back",
    "run_ranks",
    "same_plain",
    "variable_key",
]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
SAVE_COUNTER_KEY = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
_METADATA_SUFFIXES = ("/.ATTRIBUTES/jax_metadata",)


class OracleMismatch(AssertionError):
    """The checkpoint differs from the values reachable at the call."""


def escape(name: str) -> str:
    """One object-path component as TensorFlow escapes it in a checkpoint key."""
    return name.replace(".", "..").replace("/", ".S")


def variable_key(path: str) -> str:
    return f"{path}/.ATTRIBUTES/VARIABLE_VALUE"


def _py_state_key(path: str) -> str:
    return f"{path}/.ATTRIBUTES/py_state"


@dataclass
class Expected:
    """What a checkpoint must hold: tensors by key, decoded JSON plain values by key."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    plain: dict[str, Any] = field(default_factory=dict)
    raw_strings: dict[str, bytes] = field(default_factory=dict)  # PythonState payloads
    loose_py_state: set[str] = field(default_factory=set)  # keys checked for presence only
    # One tensor reachable by several paths (tied weights): a checkpoint stores it once, as
    # TensorFlow does, under any one of them. {key of the first path: keys of the others}.
    aliases: dict[str, list[str]] = field(default_factory=dict)

    def keys(self) -> set[str]:
        return set(self.tensors) | set(self.plain) | set(self.raw_strings) | self.loose_py_state

    def alias_keys(self) -> set[str]:
        return {k for others in self.aliases.values() for k in others}


# -- values -----------------------------------------------------------------------------------


def host_copy(value: Any) -> np.ndarray:
    """An independent C-ordered, little-endian numpy copy of an array-like value."""
    module = type(value).__module__
    if module.startswith("torch"):
        import torch

        tensor = value.detach().to("cpu").clone()
        if tensor.dtype == torch.bfloat16:
            import ml_dtypes

            return tensor.view(torch.int16).numpy().copy().view(ml_dtypes.bfloat16)
        return tensor.numpy().copy()
    if module.startswith(("jax", "jaxlib")):
        array = np.array(value, copy=True)
    else:
        array = np.array(value, copy=True, order="C")
    if array.dtype.kind == "U":
        return np.array(
            [s.encode("utf-8") for s in array.reshape(-1).tolist()], dtype=object
        ).reshape(array.shape)
    if array.dtype.kind == "S":
        return np.array(array.reshape(-1).tolist(), dtype=object).reshape(array.shape)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.array(array, copy=True, order="C")


def is_plain(value: Any) -> bool:
    """What trackpoint documents as a plain value (tracking/plain_values.py's contract)."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return True
    if isinstance(value, np.generic):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(is_plain(v) for v in value.values())
    return False


def builtin(value: Any) -> Any:
    """A deep copy of a plain value with tracked wrappers (dict/list subclasses) as builtins."""
    if isinstance(value, dict):
        return {k: builtin(v) for k, v in value.items()}
    if isinstance(value, list):
        return [builtin(v) for v in value]
    if isinstance(value, tuple):
        return tuple(builtin(v) for v in value)
    return copy.deepcopy(value)


def _is_jax_array(value: Any) -> bool:
    return type(value).__module__.startswith(("jax", "jaxlib")) and hasattr(value, "shape")


# -- capture ----------------------------------------------------------------------------------


def capture(roots: Mapping[str, Any], *, save_counter: int | None = None) -> Expected:
    """Deep-copy every value reachable from ``roots`` (a Checkpoint's keyword children)."""
    out = Expected()
    params: dict[int, str] = {}
    optimizers: list[tuple[str, Any]] = []
    for name, value in roots.items():
        path = escape(name)
        kind = _kind(value)
        if kind == "module":
            _capture_module(path, value, out, params)
        elif kind == "optimizer":
            optimizers.append((path, value))
        else:
            _capture_value(path, value, out)
    for path, optimizer in optimizers:
        _capture_optimizer(path, optimizer, out, params)
    if save_counter is not None:
        out.tensors[SAVE_COUNTER_KEY] = np.array(save_counter, np.int64)
    return out


def _kind(value: Any) -> str:
    if "torch" in sys.modules:
        import torch

        if isinstance(value, torch.nn.Module):
            return "module"
        if isinstance(value, torch.optim.Optimizer):
            return "optimizer"
    return "other"


def _capture_module(path: str, module: Any, out: Expected, params: dict[int, str]) -> None:
    paths: dict[int, str] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        key_path = "/".join([path, *map(escape, name.split("."))])
        first = paths.setdefault(id(tensor), key_path)
        if first == key_path:
            out.tensors[variable_key(key_path)] = host_copy(tensor)
        else:  # the same tensor again (a tied module or parameter)
            out.aliases.setdefault(variable_key(first), []).append(variable_key(key_path))
            out.aliases.setdefault(f"{first}/", []).append(f"{key_path}/")
        params.setdefault(id(tensor), key_path)


def _capture_optimizer(path: str, optimizer: Any, out: Expected, params: dict[int, str]) -> None:
    import torch

    state = optimizer.state_dict()
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    for index, slots in state["state"].items():
        owner = params.get(id(flat[index]))
        if owner is None:
            raise OracleMismatch(
                f"optimizer {path!r} holds state for a parameter no module "
                "reachable from the roots owns"
            )
        for slot, value in slots.items():
            key = variable_key(f"{owner}/.OPTIMIZER_SLOT/{path}/{escape(slot)}")
            for other in out.aliases.get(f"{owner}/", []):  # the slot may hang off any path
                out.aliases.setdefault(key, []).append(key.replace(f"{owner}/", other, 1))
            if isinstance(value, torch.Tensor):
                out.tensors[key] = host_copy(value)
            else:
                out.loose_py_state.add(key)
    groups = []
    for group in state["param_groups"]:
        hyper = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
        groups.append({"num_params": len(group["params"]), "hyperparameters": hyper})
    out.plain[_py_state_key(f"{path}/param_groups")] = ("param_groups", groups)


def _capture_value(path: str, value: Any, out: Expected) -> None:
    import trackpoint as tp

    if isinstance(value, tp.PythonState):
        out.raw_strings[_py_state_key(path)] = value.serialize()
    elif isinstance(value, tp.Variable):
        out.tensors[variable_key(path)] = host_copy(value.numpy())
    elif isinstance(value, np.ndarray) or _is_jax_array(value):
        out.tensors[variable_key(path)] = host_copy(value)
    elif _is_jax_tree(value):
        _capture_jax_tree(path, value, out)
    elif isinstance(value, (dict, list, tuple)):
        _capture_container(path, value, out)
    else:
        raise OracleMismatch(f"the oracle has no model of {type(value).__name__} at {path!r}")


def _is_jax_tree(value: Any) -> bool:
    if "jax" not in sys.modules or not isinstance(value, (dict, list, tuple)):
        return False
    import jax

    return any(_is_jax_array(leaf) for leaf in jax.tree_util.tree_leaves(value))


def _capture_jax_tree(path: str, tree: Any, out: Expected) -> None:
    """A pytree holding jax arrays: its leaves by ``jax.tree_util`` key path."""
    import jax

    for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = []
        for entry in key_path:
            for attribute in ("key", "idx", "name"):
                if hasattr(entry, attribute):
                    parts.append(escape(str(getattr(entry, attribute))))
                    break
            else:
                raise OracleMismatch(f"the oracle has no model of key path entry {entry!r}")
        if not (_is_jax_array(leaf) or isinstance(leaf, np.ndarray)):
            raise OracleMismatch(
                f"the oracle has no model of leaf {type(leaf).__name__} at "
                f"{path}{jax.tree_util.keystr(key_path)}"
            )
        out.tensors[variable_key("/".join([path, *parts]))] = host_copy(leaf)


def _capture_container(path: str, container: Any, out: Expected) -> None:
    if isinstance(container, dict):
        items = list(container.items())
    elif hasattr(container, "_fields"):  # a namedtuple: fields by name (jax pytrees)
        items = list(zip(container._fields, container))
    else:
        items = list(enumerate(container))
    plain: dict[Any, Any] = {}
    for key, value in items:
        if is_plain(value) and not _is_jax_array(value):
            plain[key] = builtin(value)
        else:
            _capture_value(f"{path}/{escape(str(key))}", value, out)
    if not plain:
        return
    if isinstance(container, dict):
        out.plain[_py_state_key(path)] = ("dict", plain)
    elif len(plain) == len(items):
        out.plain[_py_state_key(path)] = ("list", [plain[i] for i in range(len(items))])
    else:
        out.plain[_py_state_key(path)] = ("dict", {str(k): v for k, v in plain.items()})


# -- reading back -----------------------------------------------------------------------------


def _decode_json(value: Any) -> Any:
    """JSON with state_json's tags, decoded independently of trackpoint."""
    if isinstance(value, list):
        return [_decode_json(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, body),) = value.items()
            if tag == "__tuple__":
                return tuple(_decode_json(v) for v in body)
            if tag == "__ndarray__":
                raw = base64.b64decode(body["data"])
                dtype = np.dtype(body["dtype"])
                return np.frombuffer(raw, dtype).reshape(body["shape"]).copy()
            if tag == "__bytes__":
                return base64.b64decode(body)
            if tag == "__float__":
                return float(body)
            if tag == "__dict__":
                return {_hashable(_decode_json(k)): _decode_json(v) for k, v in body}
        return {k: _decode_json(v) for k, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _expected_json(kind: str, value: Any, got: Any) -> Any:
    if kind == "param_groups":  # per-parameter Python state: none for the optimizers drawn
        return {"param_groups": value, "param_state": {}}
    return value


def read_back(
    prefix: str, keys: set[str], *, use_tf: Any = None
) -> tuple[set[str], dict[str, Any]]:
    """(every key in the checkpoint, {key: value}) through tp's reader or real TensorFlow's."""
    if use_tf is not None:
        reader = use_tf.train.load_checkpoint(prefix)
        present = set(reader.get_variable_to_shape_map())
        values = {}
        for key in keys & present:
            try:
                values[key] = np.asarray(reader.get_tensor(key))
            except ValueError as exc:  # TF's Python reader cannot return float16 ("half")
                if "not supported" not in str(exc):
                    raise
        return present, values
    import trackpoint as tp

    reader = tp.load_checkpoint(prefix)
    present = set(reader.get_variable_to_shape_map())
    return present, {k: np.asarray(reader.get_tensor(k)) for k in keys & present}


def _same_array(key: str, want: np.ndarray, got: np.ndarray, where: str) -> None:
    if want.dtype == object or got.dtype == object:
        want_list = [_as_bytes(x) for x in np.asarray(want, dtype=object).reshape(-1).tolist()]
        got_list = [_as_bytes(x) for x in np.asarray(got, dtype=object).reshape(-1).tolist()]
        if want.shape != got.shape or want_list != got_list:
            raise OracleMismatch(
                f"{where}: {key}: saved strings {got_list[:8]} {got.shape}, "
                f"reachable at the call {want_list[:8]} {want.shape}"
            )
        return
    got = np.array(got, copy=True, order="C")
    if got.dtype.byteorder == ">":
        got = got.astype(got.dtype.newbyteorder("<"))
    if want.dtype != got.dtype or want.shape != got.shape:
        raise OracleMismatch(
            f"{where}: {key}: saved {got.dtype}{list(got.shape)}, reachable "
            f"at the call {want.dtype}{list(want.shape)}"
        )
    if want.tobytes() != got.tobytes():
        diff = np.flatnonzero(want.view(np.uint8).reshape(-1) != got.view(np.uint8).reshape(-1))
        raise OracleMismatch(
            f"{where}: {key}: bytes differ (first at byte {diff[0]} of "
            f"{want.nbytes}); saved {got.reshape(-1)[:6]}, reachable at the "
            f"call {want.reshape(-1)[:6]}"
        )


def _as_bytes(x: Any) -> bytes:
    return x.encode("utf-8") if isinstance(x, str) else bytes(x)


def same_plain(want: Any, got: Any) -> bool:
    """Equal with types: True is not 1, 1 is not 1.0, a tuple is not a list, -0.0 is not 0.0."""
    if isinstance(want, np.generic) or isinstance(want, np.ndarray):
        got_array = np.asarray(got)
        want_array = np.asarray(want)
        return (
            want_array.dtype == got_array.dtype
            and want_array.shape == got_array.shape
            and want_array.tobytes() == got_array.tobytes()
        )
    if type(want) is not type(got):
        return False
    if isinstance(want, float):
        return (math.isnan(want) and math.isnan(got)) or want.hex() == got.hex()
    if isinstance(want, (list, tuple)):
        return len(want) == len(got) and all(same_plain(a, b) for a, b in zip(want, got))
    if isinstance(want, dict):
        return set(want) == set(got) and all(same_plain(want[k], got[k]) for k in want)
    return bool(want == got)


def check_checkpoint(prefix: str, expected: Expected, *, tf: Any = None, where: str = "") -> None:
    """Read ``prefix`` back (tp's reader; TensorFlow's too when ``tf`` is given) and compare."""
    readers: list[tuple[str, Any]] = [("trackpoint reader", None)]
    if tf is not None:
        readers.append(("tf.train.load_checkpoint", tf))
    wanted = expected.keys() | expected.alias_keys()
    for label, use_tf in readers:
        present, values = read_back(prefix, wanted, use_tf=use_tf)
        at = f"{where} {prefix} via {label}".strip()
        missing = {
            k
            for k in expected.keys() - present
            if not any(a in present for a in expected.aliases.get(k, ()))
        }
        extra = {
            k
            for k in present - wanted
            if k not in (OBJECT_GRAPH_KEY, SAVE_COUNTER_KEY) and not k.endswith(_METADATA_SUFFIXES)
        }
        if missing or extra:
            raise OracleMismatch(
                f"{at}: keys reachable at the call but not saved "
                f"{sorted(missing)}; saved but not reachable {sorted(extra)}"
            )
        for key, want in expected.tensors.items():
            for stored in [key, *expected.aliases.get(key, ())]:
                if stored in values:
                    _same_array(stored, want, values[stored], at)
        for key, (kind, want) in expected.plain.items():
            raw = _as_bytes(values[key].reshape(()).item())
            got = _decode_json(json.loads(raw))
            if not same_plain(_expected_json(kind, want, got), got):
                raise OracleMismatch(
                    f"{at}: {key}: saved {got!r}, reachable at the call "
                    f"{_expected_json(kind, want, got)!r}"
                )
        for key, want_raw in expected.raw_strings.items():
            raw = _as_bytes(values[key].reshape(()).item())
            if raw != want_raw:
                raise OracleMismatch(
                    f"{at}: {key}: saved {raw!r}, reachable at the call {want_raw!r}"
                )


def assert_same(expected: Expected, got: Expected, where: str) -> None:
    """Two captures are equal (e.g. the values at a save and a fresh restore of it)."""
    if expected.keys() != got.keys():
        raise OracleMismatch(
            f"{where}: keys differ: only at the call "
            f"{sorted(expected.keys() - got.keys())}, only after "
            f"{sorted(got.keys() - expected.keys())}"
        )
    for key, want in expected.tensors.items():
        _same_array(key, want, got.tensors[key], where)
    for key, (_, want) in expected.plain.items():
        if not same_plain(want, got.plain[key][1]):
            raise OracleMismatch(f"{where}: {key}: {got.plain[key][1]!r} != {want!r}")
    for key, want_raw in expected.raw_strings.items():
        if got.raw_strings[key] != want_raw:
            raise OracleMismatch(f"{where}: {key}: {got.raw_strings[key]!r} != {want_raw!r}")


# -- threads as ranks -------------------------------------------------------------------------


def run_ranks(world: int, work: Callable[[int, Any], Any], *, timeout: float = 60) -> list[Any]:
    """``work(rank, collective)`` on ``world`` threads of one ``tpd.ThreadGroup``; each rank's
    result, or the exception it raised."""
    import threading

    import trackpoint.distributed as tpd

    group = tpd.ThreadGroup(world, timeout=timeout)
    results: list[Any] = [None] * world

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank, group.collective(rank))
        except BaseException as exc:  # noqa: BLE001  (returned to the test)
            results[rank] = exc

    threads = [
        threading.Thread(target=target, args=(r,), name=f"oracle-rank{r}") for r in range(world)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout * 3)
    if any(t.is_alive() for t in threads):
        raise AssertionError("a rank is stuck")
    return results


# -- subprocess workers --------------------------------------------------------------------------


def _keras_main(workdir: str) -> None:
    """Fit twice (sync and async saves), copying every variable at each epoch's end."""
    import os

    import keras

    import trackpoint as tp

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((64, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    runs = []
    for mode in ("sync", "async"):
        directory = os.path.join(workdir, mode)
        os.makedirs(directory)
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        epochs: list[list[tuple[str, str, str]]] = []

        class Capture(keras.callbacks.Callback):  # type: ignore[misc]
            def __init__(self, directory: str, epochs: list[Any]) -> None:
                super().__init__()
                self.directory, self.epochs = directory, epochs

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                pairs = [("model", v) for v in self.model.variables]
                pairs += [("optimizer", v) for v in self.model.optimizer.variables]
                arrays = {
                    f"v{i}": np.array(keras.ops.convert_to_numpy(v), copy=True)
                    for i, (_, v) in enumerate(pairs)
                }
                import torch  # the torch backend draws unseeded dropout from torch's generator

                arrays["torch_rng"] = torch.random.get_rng_state().numpy().copy()
                np.savez(os.path.join(self.directory, f"capture-{epoch + 1}.npz"), **arrays)
                names = {"model": self.model.name, "optimizer": self.model.optimizer.name}
                self.epochs.append([(owner, names[owner], v.path) for owner, v in pairs])

        options = tp.CheckpointOptions(enable_async=True) if mode == "async" else None
        saving = tp.keras.TrackpointCheckpoint(directory, max_to_keep=None, options=options)
        model.fit(
            x, y, epochs=3, batch_size=16, verbose=0, callbacks=[Capture(directory, epochs), saving]
        )
        runs.append({"mode": mode, "directory": directory, "epochs": epochs})
    with open(os.path.join(workdir, "captures.json"), "w") as out:
        json.dump(runs, out)


def _jax_main(workdir: str, port: str, count: str, index: str) -> None:
    """One process of a jax.distributed job: three saves of global arrays through a
    CheckpointManager on a DistributedCheckpoint (sync; after ``ckpt.params = new`` async,
    rebinding again right after the call; incremental), the full values at each call copied
    with ``process_allgather`` into ``expected-<n>.npz`` by process 0."""
    import os

    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    import trackpoint as tp
    import trackpoint.distributed as tpd

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        initialization_timeout=300,
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))

    def global_array(full: np.ndarray, spec: tuple[Any, ...]) -> Any:
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
        return jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])

    def tree(version: int) -> dict[str, Any]:
        base = np.arange(32, dtype=np.float32).reshape(8, 4) * (version + 1)
        params = {
            "rows": global_array(base, ("x", None)),
            "whole": global_array(np.arange(3, dtype=np.int32) + version, ()),
            "low": global_array(base.astype(jnp.bfloat16), (None, "x")),
        }
        if version:
            params[f"new{version}"] = global_array(np.full((4,), version, np.float32), ("x",))
        return params

    def expected(roots: dict[str, Any], number: int) -> None:
        full = {
            name: {
                k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
                for k, v in value.items()
            }
            for name, value in roots.items()
        }
        if jax.process_index() == 0:
            want = capture(full, save_counter=number).tensors
            keys = sorted(want)
            np.savez(
                os.path.join(workdir, f"expected-{number}.npz"),
                **{f"v{i}": want[k] for i, k in enumerate(keys)},
            )
            with open(os.path.join(workdir, f"expected-{number}.json"), "w") as out:
                json.dump([[k, want[k].dtype.name] for k in keys], out)  # npz drops bfloat16

    directory = os.path.join(workdir, "ckpts")
    first = tree(0)
    ckpt = tpd.DistributedCheckpoint(params=first, timeout=240)
    manager = tp.CheckpointManager(ckpt, directory, max_to_keep=5)
    prefixes = []
    expected({"params": first}, 1)
    prefixes.append(manager.save())
    ckpt.params = tree(1)  # a JAX update makes a new tree: rebinding (issue 27 #11)
    expected({"params": tree(1)}, 2)
    prefixes.append(manager.save(options=tp.CheckpointOptions(enable_async=True)))
    ckpt.params = tree(5)  # right after the call: the save must keep tree(1)
    manager.sync()
    ckpt.params = tree(2)
    expected({"params": tree(2)}, 3)
    prefixes.append(manager.save(options=tp.CheckpointOptions(incremental=True)))
    manager.sync()
    ckpt.close()
    with open(os.path.join(workdir, f"result-{index}.json"), "w") as out:
        json.dump({"prefixes": prefixes}, out)
    jax.distributed.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "keras":
        _keras_main(sys.argv[2])
    elif sys.argv[1] == "jax":
        _jax_main(*sys.argv[2:6])
