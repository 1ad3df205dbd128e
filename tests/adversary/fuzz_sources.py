"""Real checkpoints for the structured fuzzer, written by trackpoint, and their live objects.

Each :class:`Source` holds a checkpoint's files (from numpy state, torch state and JAX state,
the last two only if importable, and a bundle of partitioned tensors) and knows how to make a
*fresh* copy of the live objects (same structure, other values), snapshot them, and restore a
checkpoint into them. The values a restore of the pristine checkpoint gives are recorded once
as ``expected``; the fuzzer holds every mutated restore to them.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import trackpoint as tp
from tests.adversary.fuzz_mutate import GRAPH_KEY, Files
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
from trackpoint.bundle.table import read_table
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import CheckpointError

__all__ = ["Live", "Source", "build_sources", "same"]


def same(a: Any, b: Any) -> bool:
    """Exact equality of snapshots: types, dtypes, shapes and bytes (NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return a.tolist() == b.tolist()
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return bool(a == b)


@dataclass
class Live:
    """Fresh live objects: ``snapshot()`` their values, ``restore(prefix)`` a checkpoint
    into them (raising what the restore or its ``assert_consumed`` raises)."""

    snapshot: Callable[[], Any]
    restore: Callable[[str], None]


@dataclass
class Source:
    name: str
    files: Files
    prefix_name: str
    make_live: Callable[[], Live] | None
    expected: Any = None
    reads: dict[str, Any] = field(default_factory=dict)  # key -> array, or the error type
    info: dict[str, Any] = field(default_factory=dict)
    # Other readers of the whole checkpoint: name -> (read(prefix) -> snapshot, pristine's).
    extra_reads: dict[str, tuple[Callable[[str], Any], Any]] = field(default_factory=dict)


class AssertFailed(Exception):
    """``assert_consumed`` raised AssertionError (allowed: the load status did its job)."""


def _restore_with(make_checkpoint: Callable[[], tp.Checkpoint]) -> Callable[[str], None]:
    def restore(prefix: str) -> None:
        status = make_checkpoint().restore(prefix)
        try:
            status.assert_consumed()
        except AssertionError as exc:
            raise AssertFailed(str(exc)) from exc

    return restore


# -- numpy ----------------------------------------------------------------------------------
def _numpy_objects(saved: bool) -> dict[str, Any]:
    from trackpoint.distributed import Slice
    from trackpoint.tracking.state_json import JsonState

    k = 1.0 if saved else -3.0
    w = tp.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) * k)
    strings = [b"alpha", b"", b"z" * 40] if saved else [b"fresh", b"x", b"y"]
    return {
        "w": w,
        "alias": w,
        "counts": tp.Variable(np.array([1, 2, 3], np.int64) * int(k)),
        "s": tp.Variable(np.array(strings, dtype=object)),
        "layers": [tp.Variable(np.full((2,), 5.0 * k)), tp.Variable(np.float16(k))],
        "table": {"a": tp.Variable(np.eye(2) * k), "epoch": 3 if saved else 0,
                  "tags": ["x", (1, 2)] if saved else [], "big": 2**70 if saved else 1,
                  "f": 1.5 if saved else 0.0},
        "js": JsonState(step=7 if saved else 0, arr=np.arange(3) * int(k)),
        "pv": tp.ParallelVariable([np.ones(2) * k, np.zeros(2) + k]),
        "sl": Slice(np.arange(6.0).reshape(2, 3) * k, (4, 3), (0, 0)),
    }


def _numpy_snapshot(objects: dict[str, Any]) -> Any:
    def snap(value: Any) -> Any:
        if isinstance(value, tp.Variable):
            return np.array(value.numpy(), copy=True)
        if isinstance(value, tp.ParallelVariable):
            return [np.array(c, copy=True) for c in value.components]
        if type(value).__name__ == "Slice":
            return np.array(value.local, copy=True)
        if isinstance(value, dict):
            return {key: snap(item) for key, item in dict.items(value)}
        if isinstance(value, (list, tuple)):
            return type(value)(snap(item) for item in value) if isinstance(value, tuple) \
                else [snap(item) for item in value]
        return copy.deepcopy(value)

    return {name: snap(value) for name, value in objects.items()}


def _numpy_source(root: str) -> Source:
    objects = _numpy_objects(True)
    prefix = tp.Checkpoint(**objects).save(os.path.join(root, "ckpt"))

    def make_live() -> Live:
        fresh = _numpy_objects(False)
        return Live(lambda: _numpy_snapshot(fresh),
                    _restore_with(lambda: tp.Checkpoint(**fresh)))

    return _source("numpy", root, prefix, make_live)


# -- torch ------------------------------------------------------------------------------------
def _torch_objects(seed: int, train: bool) -> tuple[Any, ...]:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    if train:
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.ones(5, 4)).sum().backward()
            optimizer.step()
            scheduler.step()
    return model, optimizer, scheduler


def _torch_snapshot(model: Any, optimizer: Any, scheduler: Any) -> Any:
    import torch

    def snap(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().numpy().copy()
        if isinstance(value, dict):
            return {key: snap(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [snap(item) for item in value]
        return copy.deepcopy(value)

    return {"model": snap(model.state_dict()), "optimizer": snap(optimizer.state_dict()),
            "scheduler": snap(scheduler.state_dict())}


def _torch_source(root: str) -> Source:
    model, optimizer, scheduler = _torch_objects(0, True)
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer, scheduler=scheduler)
    prefix = ckpt.write(os.path.join(root, "ckpt"))

    def make_live() -> Live:
        fresh = _torch_objects(1, False)
        return Live(lambda: _torch_snapshot(*fresh), _restore_with(
            lambda: tp.Checkpoint(model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])))

    def state_dict(path: str) -> Any:
        return {name: tensor.numpy() for name, tensor in
                tp.torch.load_state_dict(path, "model").items()}

    return _source("torch", root, prefix, make_live, {"torch.load_state_dict": state_dict})


# -- jax --------------------------------------------------------------------------------------
def _jax_tree(saved: bool) -> dict[str, Any]:
    import jax.numpy as jnp

    k = 1 if saved else 0
    return {"params": {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * k,
                       "b": jnp.array([1, 2, 3], jnp.int32) * k},
            "step": 3 * k, "lr": 0.5 if saved else 0.0}


def _jax_source(root: str) -> Source:
    import jax

    prefix = tp.jax.write(os.path.join(root, "ckpt"), _jax_tree(True))

    def make_live() -> Live:
        target = _jax_tree(False)
        result: dict[str, Any] = {}

        def snapshot() -> Any:
            tree = result.get("tree", target)
            return [np.asarray(leaf).copy() if hasattr(leaf, "shape") else leaf
                    for leaf in jax.tree_util.tree_leaves(tree)]

        def restore(path: str) -> None:
            result["tree"] = tp.jax.restore(path, target)

        return Live(snapshot, restore)

    def untargeted(path: str) -> Any:
        return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tp.jax.restore(path))]

    return _source("jax", root, prefix, make_live, {"jax.restore without target": untargeted})


# -- a bundle of partitioned tensors (read paths only) ---------------------------------------
def _sliced_source(root: str) -> Source:
    prefix = os.path.join(root, "sliced")
    full = np.arange(50, dtype=np.float32).reshape(5, 10)
    strings = np.array([[b"a", b"bb"], [b"", b"ccc"], [b"d", b"e"]], dtype=object)
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", full[:2])
        writer.add_slice("t", (5, 10), "2,3:-", full[2:])
        writer.add_slice("s", (3, 2), "-:0,1", strings[:, :1])
        writer.add_slice("s", (3, 2), "-:1,1", strings[:, 1:])
        writer.add("plain", np.arange(4, dtype=np.int32))
    return _source("sliced", root, prefix, None)


# -- common -----------------------------------------------------------------------------------
def _source(name: str, root: str, prefix: str, make_live: Callable[[], Live] | None,
            extra_reads: dict[str, Callable[[str], Any]] | None = None) -> Source:
    base = os.path.basename(prefix)
    index = open(prefix + ".index", "rb").read()
    data = {}
    for entry in sorted(os.listdir(root)):
        if entry.startswith(base + ".data-"):
            data[entry[len(base):]] = open(os.path.join(root, entry), "rb").read()
    state_path = os.path.join(root, "checkpoint")
    state = open(state_path, "rb").read() if os.path.exists(state_path) else None
    files = Files(index, data, state)
    source = Source(name, files, base, make_live)
    rows = read_table(index, prefix).pairs()
    keys = [key for key, _ in rows if key]
    py_state = [key for key in keys if key.endswith(b"py_state")]
    nodes = 0
    if GRAPH_KEY in keys:
        nodes = len(tp.object_metadata(prefix).nodes)
    source.info = {"entry_keys": keys, "py_state_keys": py_state, "nodes": nodes,
                   "has_state": state is not None,
                   "slice_keys": [k for k, v in rows
                                  if k and BundleEntryProto.FromString(v).slices],
                   "string_keys": [k for k, v in rows
                                   if k and BundleEntryProto.FromString(v).dtype == 7
                                   and not BundleEntryProto.FromString(v).slices]}
    reader = tp.load_checkpoint(prefix)
    for key in reader.get_variable_to_shape_map():
        try:
            source.reads[key] = reader.get_tensor(key)
        except CheckpointError as exc:
            source.reads[key] = type(exc)
    for label, read in (extra_reads or {}).items():
        source.extra_reads[label] = (read, read(prefix))
    if make_live is not None:
        live = make_live()
        live.restore(prefix)
        source.expected = live.snapshot()
        fresh = make_live()
        if same(fresh.snapshot(), source.expected):
            raise AssertionError(f"{name}: fresh objects already hold the saved values")
    return source


def build_sources(root: str, names: list[str] | None = None) -> list[Source]:
    """Every source whose framework is importable (or those in ``names``), under ``root``."""
    builders: dict[str, Callable[[str], Source]] = {"numpy": _numpy_source,
                                                    "sliced": _sliced_source}
    if importlib.util.find_spec("torch") is not None:
        builders["torch"] = _torch_source
    if importlib.util.find_spec("jax") is not None:
        builders["jax"] = _jax_source
    sources = []
    for name, build in builders.items():
        if names is not None and name not in names:
            continue
        directory = os.path.join(root, name)
        os.makedirs(directory)
        sources.append(build(directory))
    return sources
