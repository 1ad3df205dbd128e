"""The ``many`` workload's systems (issue 28): a model's worth of small values, as users hold it.

The workload (:func:`bench.workloads.many_workload`) is ``layers`` Linear(32, 32) layers and
their AdamW state, 8 values per layer. Every trackpoint row saves with a fresh ``tp.Checkpoint``
per call and restores with a fresh one into a fresh, zeroed target; the state is the same arrays
in three shapes:

* ``tp-many-numpy``: a nested dict of numpy arrays, ``tp.Checkpoint(model=..., optim=...)``;
* ``tp-many-torch``: a ``torch.nn.ModuleList`` of ``Linear(32, 32)`` and its ``AdamW`` with its
  state, ``tp.Checkpoint(model=model, optimizer=optimizer)``;
* ``tp-many-jax``: the nested dict with jax arrays, saved with ``tp.Checkpoint`` and read back
  with ``tp.jax.restore`` (JAX arrays are immutable: the restore returns new ones);

and the torch case's peers, on the same module and optimizer:

* ``torch-many``: ``torch.save`` of ``{"model": model.state_dict(), "optim":
  optimizer.state_dict()}``; restore is ``torch.load(weights_only=True)`` and both
  ``load_state_dict`` calls;
* ``dcp-many``: ``torch.distributed.checkpoint.save``/``load`` of the same two state dicts in
  one process without a process group (DCP's single-process mode); the load fills the target's
  tensors in place (its optimizer state is initialised, as a live one is).

Every system rebuilds its objects before each repetition (``reuse_objects = False``, untimed):
no save or restore meets objects an earlier call has touched. Restores are verified by reading
the values back out of the target model, optimizer, dict or returned tree.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bench.systems import System, _tp_api
from bench.workloads import MANY_PARAMS, MANY_SLOTS, MANY_VALUES_PER_LAYER, TensorSpec

__all__ = [
    "MANY_SYSTEMS",
    "DcpMany",
    "TorchMany",
    "TrackpointManyJax",
    "TrackpointManyNumpy",
    "TrackpointManyTorch",
]

State = dict[str, np.ndarray]


def _layers(specs: tuple[TensorSpec, ...]) -> int:
    return len(specs) // MANY_VALUES_PER_LAYER


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"model/0/weight": a}`` → ``{"model": {"0": {"weight": a}}}``."""
    root: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def _lookup(tree: Any, name: str) -> Any:
    """The leaf of a nested mapping (dicts, trackpoint's wrappers) at a flat ``name``."""
    for part in name.split("/"):
        tree = tree[part]
    return tree


def _host(value: Any) -> np.ndarray:
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        return np.asarray(value.numpy())
    return np.asarray(value)


class _Many(System):
    kinds = ("many",)
    reuse_objects = False

    def reset_template(self, template: Any) -> None:
        raise AssertionError(f"{self.key} rebuilds its template before every repetition")


# -- trackpoint, numpy nested dict --------------------------------------------------------------
class TrackpointManyNumpy(_Many):
    key = "tp-many-numpy"
    label = "trackpoint, numpy nested dict"
    group = "trackpoint"
    in_place = True

    def unavailable(self) -> str | None:
        try:
            _tp_api()
        except ImportError as exc:
            return f"not available ({exc})"
        return None

    def prepare_save(self, state: State) -> Any:
        return _nest(state)

    def save(self, native: Any, prefix: str) -> None:
        _tp_api()[0](**native).write(prefix)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return _nest(_zeros(specs))

    def restore(self, prefix: str, template: Any) -> Any:
        _tp_api()[0](**template).read(prefix).assert_consumed()
        return template

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return {s.name: _host(_lookup(restored, s.name)) for s in specs}


def _zeros(specs: tuple[TensorSpec, ...]) -> State:
    out = {}
    for s in specs:
        a = np.empty(s.shape, s.dtype)
        a.fill(0)
        out[s.name] = a
    return out


# -- torch: a module and its optimizer ----------------------------------------------------------
def _torch_unavailable() -> str | None:
    return None if importlib.util.find_spec("torch") else "not installed"


def _torch_pair(layers: int, value: Callable[[str], np.ndarray] | None) -> tuple[Any, Any]:
    """A ModuleList of ``layers`` Linear(32, 32) and its AdamW, state initialised.

    Values come from ``value(name)`` (copied into torch's own memory), or are zeros: the live
    model and optimizer a restore fills.
    """
    import torch
    from torch import nn

    model = nn.ModuleList(nn.utils.skip_init(nn.Linear, 32, 32) for _ in range(layers))  # type: ignore[no-untyped-call]
    optimizer = torch.optim.AdamW(model.parameters())

    def tensor(name: str, like: Any) -> Any:
        if value is None:
            return torch.zeros_like(like)
        return torch.from_numpy(np.array(value(name), copy=True))

    with torch.no_grad():
        for i, linear in enumerate(model):
            for p in MANY_PARAMS:
                param = getattr(linear, p)
                param.copy_(tensor(f"model/{i}/{p}", param))
                optimizer.state[param] = {
                    slot: (
                        tensor(f"optim/{i}/{p}/{slot}", torch.zeros((), dtype=torch.float32))
                        if slot == "step"
                        else tensor(f"optim/{i}/{p}/{slot}", param)
                    )
                    for slot in MANY_SLOTS
                }
    return model, optimizer


def _torch_values(pair: tuple[Any, Any]) -> Iterator[tuple[str, np.ndarray]]:
    model, optimizer = pair
    for i, linear in enumerate(model):
        for p in MANY_PARAMS:
            param = getattr(linear, p)
            yield f"model/{i}/{p}", param.detach().numpy()
            state = optimizer.state.get(param, {})
            for slot in MANY_SLOTS:
                if slot in state:
                    yield f"optim/{i}/{p}/{slot}", state[slot].detach().numpy()


class _TorchMany(_Many):
    in_place = True

    def unavailable(self) -> str | None:
        return _torch_unavailable()

    def prepare_save(self, state: State) -> Any:
        return _torch_pair(len(state) // MANY_VALUES_PER_LAYER, state.__getitem__)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return _torch_pair(_layers(specs), None)

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return dict(_torch_values(restored))


class TrackpointManyTorch(_TorchMany):
    key = "tp-many-torch"
    label = "trackpoint, torch module + AdamW"
    group = "trackpoint"

    def unavailable(self) -> str | None:
        return _torch_unavailable() or TrackpointManyNumpy().unavailable()

    def save(self, native: Any, prefix: str) -> None:
        model, optimizer = native
        _tp_api()[0](model=model, optimizer=optimizer).write(prefix)

    def restore(self, prefix: str, template: Any) -> Any:
        model, optimizer = template
        _tp_api()[0](model=model, optimizer=optimizer).read(prefix).assert_consumed()
        return template


class TorchMany(_TorchMany):
    key = "torch-many"
    label = "torch.save/load + load_state_dict"

    def save(self, native: Any, prefix: str) -> None:
        import torch

        model, optimizer = native
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, prefix + ".pt")

    def restore(self, prefix: str, template: Any) -> Any:
        import torch

        model, optimizer = template
        state = torch.load(prefix + ".pt", weights_only=True, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        return template


class DcpMany(_TorchMany):
    key = "dcp-many"
    label = "DCP save/load (1 process)"

    def unavailable(self) -> str | None:
        reason = _torch_unavailable()
        if reason is None and importlib.util.find_spec("torch.distributed.checkpoint") is None:
            reason = "torch.distributed.checkpoint is not available"
        return reason

    def save(self, native: Any, prefix: str) -> None:
        import torch.distributed.checkpoint as dcp

        model, optimizer = native
        with warnings.catch_warnings():  # "no process group: assuming a single process"
            warnings.simplefilter("ignore")
            dcp.save(  # type: ignore[attr-defined]
                {"model": model.state_dict(), "optim": optimizer.state_dict()},
                checkpoint_id=prefix + ".dcp",
            )

    def restore(self, prefix: str, template: Any) -> Any:
        import torch.distributed.checkpoint as dcp

        model, optimizer = template
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(  # type: ignore[attr-defined]
                {"model": model.state_dict(), "optim": optimizer.state_dict()},
                checkpoint_id=prefix + ".dcp",
            )
        return template


# -- trackpoint, JAX pytree ---------------------------------------------------------------------
class TrackpointManyJax(_Many):
    key = "tp-many-jax"
    label = "trackpoint, JAX pytree (tp.jax)"
    group = "trackpoint"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed"
        return TrackpointManyNumpy().unavailable()

    @staticmethod
    def _tree(arrays: State) -> dict[str, Any]:
        import jax

        names = list(arrays)
        on_device = jax.device_put([arrays[n] for n in names])
        jax.block_until_ready(on_device)  # type: ignore[no-untyped-call]
        return _nest(dict(zip(names, on_device)))

    def prepare_save(self, state: State) -> Any:
        return self._tree(state)

    def save(self, native: Any, prefix: str) -> None:
        _tp_api()[0](**native).write(prefix)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return self._tree(_zeros(specs))

    def restore(self, prefix: str, template: Any) -> Any:
        import jax

        import trackpoint as tp

        restored = tp.jax.restore(prefix, template)
        return jax.block_until_ready(restored)  # type: ignore[no-untyped-call]

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return {s.name: np.asarray(_lookup(restored, s.name)) for s in specs}


MANY_SYSTEMS: tuple[type[System], ...] = (
    TrackpointManyNumpy,
    TrackpointManyTorch,
    TrackpointManyJax,
    TorchMany,
    DcpMany,
)
"""Row order of the ``many`` tables: the three paths, then the torch case's peers."""
