"""``torch.optim.Optimizer`` as an optimizer node with slot variables (semantics F1–F4).

Per-parameter tensor state (Adam's ``exp_avg``/``exp_avg_sq``/``step``, SGD's
``momentum_buffer``) is saved as slot variables of the parameter, named by the state key:
``model/0/weight/.OPTIMIZER_SLOT/optimizer/exp_avg/.ATTRIBUTES/VARIABLE_VALUE``
(tf-checkpoint-format.md §9.3). Everything else, per-group hyperparameters (``lr``, ``betas``,
``momentum``, ``initial_lr`` added by schedulers, ...) and per-parameter state that is not a
tensor, is ordinary state: one JSON ``PythonState`` child named ``param_groups``.

Restoring into an optimizer whose state is still empty (a fresh process, before the first
``step()``) creates the state tensors from the checkpoint, on the device torch itself would
use (``step`` stays on the CPU unless the group is ``capturable`` or ``fused``), so the next
``step()`` continues exactly where the saved run stopped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import numpy as np
import torch

from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.torch_tensors import (
    TENSOR_JSON_HOOKS,
    TensorVariable,
    is_uninitialized,
    tensor_from_numpy,
    tensor_to_json,
    torch_dtype_for,
)
from trackpoint.tracking.adapters import to_trackable, to_trackables
from trackpoint.tracking.base import DeferredRestoration, Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.slots import PendingSlot, SlotOwner
from trackpoint.tracking.state_json import dumps, loads
from trackpoint.tracking.variable import Variable

__all__ = ["PARAM_GROUPS_NAME", "OptimizerAdapter", "OptimizerConfig"]

PARAM_GROUPS_NAME = "param_groups"
"""Local name of the optimizer's non-slot state (the ``OptimizerConfig`` child)."""


def _is_state_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and not is_uninitialized(value)


def _param_of(variable: Any) -> torch.Tensor | None:
    if isinstance(variable, TensorVariable):
        return variable.tensor
    if isinstance(variable, torch.Tensor):
        return variable
    return None


class OptimizerConfig(PythonState):
    """An optimizer's hyperparameters and non-tensor per-parameter state, as JSON.

    JSON layout: ``{"param_groups": [{"num_params": n, "hyperparameters": {...}}, ...],
    "param_state": {"<index>": {key: value}}}``; parameters are indexed across groups in
    order, as in ``Optimizer.state_dict()``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    def __repr__(self) -> str:
        return f"<torch {type(self._optimizer).__name__} param_groups>"

    def _what(self) -> str:
        return f"{type(self._optimizer).__name__} param_groups"

    def serialize(self) -> bytes:
        # docstring inherited
        optimizer = self._optimizer
        groups = []
        param_state: dict[str, dict[str, Any]] = {}
        index = 0
        for group in optimizer.param_groups:
            groups.append({
                "num_params": len(group["params"]),
                "hyperparameters": {k: v for k, v in group.items() if k != "params"},
            })
            for param in group["params"]:
                state = optimizer.state.get(param)
                if state:
                    extra = {k: v for k, v in state.items() if not _is_state_tensor(v)}
                    if extra:
                        param_state[str(index)] = extra
                index += 1
        data = {"param_groups": groups, "param_state": param_state}
        return dumps(data, what=self._what(), default=tensor_to_json)

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited: the group layout is checked before the restore changes anything
        optimizer = self._optimizer
        what = self._what()
        saved = loads(data, what=what, hooks=TENSOR_JSON_HOOKS)
        try:
            saved_groups = saved["param_groups"]
            param_state = saved["param_state"]
            sizes = [int(group["num_params"]) for group in saved_groups]
            hyper = [dict(group["hyperparameters"]) for group in saved_groups]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{what}: malformed saved state ({exc!r})") from exc
        live_sizes = [len(group["params"]) for group in optimizer.param_groups]
        if sizes != live_sizes:
            raise InvalidArgumentError(
                f"the checkpoint's {what} has groups of {sizes} parameters, the optimizer has "
                f"{live_sizes}; build the optimizer with the same parameter groups as the run "
                "that saved it"
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for key in param_state:
            if not str(key).isdigit() or int(key) >= len(params):
                raise InvalidArgumentError(
                    f"{what}: state for parameter #{key}, but the optimizer has {len(params)}"
                )
        def apply() -> None:
            for group, values in zip(optimizer.param_groups, hyper):
                for key, value in values.items():
                    group[key] = _merge(group.get(key), value)
            for key, values in param_state.items():
                param = params[int(key)]
                optimizer.state[param].update(
                    {k: _to_device(v, param.device) for k, v in values.items()}
                )

        return apply


def _merge(live: Any, saved: Any) -> Any:
    """The restored value: copied into a live tensor of the same shape (keeps its identity)."""
    if (
        isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor)
        and live.shape == saved.shape and live.dtype == saved.dtype
    ):
        with torch.no_grad():
            live.copy_(saved)
        return live
    return saved


def _state_name(kind: str, slot_name: str, param: torch.Tensor) -> str:
    """The name of optimizer state in messages, with its parameter's name as of now."""
    owner = to_trackable(param)
    described = owner.name if isinstance(owner, TensorVariable) else "a parameter"
    return f"{kind} state {slot_name!r} of {described}"


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    return value


class OptimizerAdapter(SlotOwner):
    """Adapter: a ``torch.optim.Optimizer`` whose per-parameter tensors are slot variables.

    Slot names are the optimizer's state keys. Slots are looked up in ``optimizer.state`` on
    every save, so state created by ``step()`` needs no registration.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._config = OptimizerConfig(optimizer)
        self._slot_adapters: dict[tuple[str, int], TensorVariable] = {}
        # id(param) -> (group, index in group["params"]), rebuilt when a lookup misses: planning
        # a restore asks once per slot, so a scan of every parameter each time is quadratic.
        self._param_index: dict[int, tuple[dict[str, Any], int]] = {}
        self._param_index_shape: list[tuple[int, int]] = []

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def __repr__(self) -> str:
        return f"<torch optimizer {type(self._optimizer).__name__}>"

    # -- children ------------------------------------------------------------------------------

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        return {PARAM_GROUPS_NAME: self._config}

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        return (cached_dependencies or self._trackable_children()).get(name)

    # -- slots ---------------------------------------------------------------------------------

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self._optimizer.param_groups for p in group["params"]]

    def _group_of(self, param: torch.Tensor) -> dict[str, Any] | None:
        """The param group holding ``param`` (by identity), or None; O(1) while groups hold."""
        found = self._param_index.get(id(param))
        if found is not None:
            group, index = found
            params = group["params"]
            if index < len(params) and params[index] is param:
                return group
        groups = self._optimizer.param_groups
        shape = [(id(group["params"]), len(group["params"])) for group in groups]
        if found is None and shape == self._param_index_shape:
            return None  # not this optimizer's parameter, and the groups are as indexed
        # Groups edited since the index was built (add_param_group, a list edited in place):
        # rebuild once and answer from the fresh index.
        self._param_index = {
            id(p): (group, index) for group in groups for index, p in enumerate(group["params"])
        }
        self._param_index_shape = shape
        found = self._param_index.get(id(param))
        return None if found is None else found[0]

    def _slot_variables(self) -> list[tuple[str, Any]]:
        # docstring inherited: every parameter, with or without state. A parameter the root
        # does not reach would be left out of the checkpoint (its value, and its state if it
        # has any) while the optimizer keeps updating it: plain SGD has no state to miss, yet
        # the value is lost all the same, so the save refuses it by name.
        state = self._optimizer.state
        return [
            (f"parameter {index} of param_groups[{group_index}] (shape {tuple(param.shape)})"
             + (" and its optimizer state" if state.get(param) else ""), param)
            for group_index, group in enumerate(self._optimizer.param_groups)
            for index, param in enumerate(group["params"])
        ]

    def get_slot_names(self) -> list[str]:
        # docstring inherited
        names: set[str] = set()
        params = set(map(id, self._params()))
        # The state's own items (no tensor hashed), of this optimizer's parameters only; each
        # key's value is asked about until the key is known to be a slot name.
        for param, state in self._optimizer.state.items():
            if state and id(param) in params:
                names.update(
                    k for k, v in state.items() if k not in names and _is_state_tensor(v)
                )
        return sorted(names)

    def get_slot(self, variable: Any, slot_name: str) -> Trackable | None:  # type: ignore[override]
        # docstring inherited
        # Asked for every object of a walk and every slot name: the cached adapter first.
        if isinstance(variable, TensorVariable):
            param = variable.tensor
        elif isinstance(variable, torch.Tensor):
            param = variable
        else:
            return None
        state = self._optimizer.state.get(param)
        if not state:
            return None
        value = state.get(slot_name)
        if value is None:
            return None
        cached = self._slot_adapters.get((slot_name, id(param)))
        if cached is not None and cached.tensor is value:
            return cached  # made for this very tensor, a state tensor then and so now
        if not _is_state_tensor(value):
            return None
        if not self._slot_adapters:  # the first slot asked for: adapt them all, in one batch
            self._adapt_state()
            cached = self._slot_adapters.get((slot_name, id(param)))
            if cached is not None and cached.tensor is value:
                return cached
        return self._slot_adapter(param, slot_name, value, variable)

    def _adapt_state(self) -> None:
        """Adapters of every state tensor of every parameter, made in one ``to_trackables``
        call (a third of the cost each). Once per adapter: a save or restore meets the slots
        of a fresh optimizer 100,000 at a time; state made later is adapted as it is met."""
        keys: list[tuple[str, int]] = []
        values: list[torch.Tensor] = []
        params: list[torch.Tensor] = []
        state = self._optimizer.state
        for param in self._params():
            entries = state.get(param)
            if not entries:
                continue
            for slot_name, value in entries.items():
                if _is_state_tensor(value):
                    keys.append((slot_name, id(param)))
                    values.append(value)
                    params.append(param)
        kind = type(self._optimizer).__name__
        for key, adapter, param in zip(keys, to_trackables(values), params, strict=True):
            assert isinstance(adapter, TensorVariable)
            adapter.set_name(functools.partial(_state_name, kind, key[0], param))
            self._slot_adapters[key] = adapter

    def _slot_adapter(
        self, param: torch.Tensor, slot_name: str, value: torch.Tensor, variable: Any
    ) -> TensorVariable:
        key = (slot_name, id(param))
        cached = self._slot_adapters.get(key)
        if cached is not None and cached.tensor is value:
            return cached
        adapter = to_trackable(value)
        assert isinstance(adapter, TensorVariable)
        owner = variable.name if isinstance(variable, TensorVariable) else "a parameter"
        adapter.set_name(f"{type(self._optimizer).__name__} state {slot_name!r} of {owner}")
        self._slot_adapters[key] = adapter
        return adapter

    def add_slot(
        self, variable: Any, slot_name: str, initial_value: Any = None, *, dtype: Any = None
    ) -> Variable:
        """Not supported: a torch optimizer creates its own state in ``step()``."""
        raise NotImplementedError(
            "torch optimizers create their per-parameter state in step(); trackpoint reads it "
            "from optimizer.state and cannot add numpy slots to it"
        )

    def _state_device(self, param: torch.Tensor, slot_name: str) -> torch.device:
        """Where torch keeps this state (``Optimizer._process_value_according_to_param_policy``)."""
        if slot_name == "step":
            group = self._group_of(param)
            if group is not None and not (group.get("capturable") or group.get("fused")):
                return torch.device("cpu")
        return param.device

    def _plan_slot_variable(
        self, slot_variable_position: DeferredRestoration, variable: Trackable, slot_name: str
    ) -> Trackable | None:
        # docstring inherited
        param = _param_of(variable)
        if param is None or self._group_of(param) is None:
            return None  # not this optimizer's parameter: the slot stays unresolved
        existing = self.get_slot(variable, slot_name)
        if existing is not None:
            return existing
        spec = slot_variable_position.value_spec()
        if spec is None:
            return None
        shape, numpy_dtype = spec
        dtype = torch_dtype_for(numpy_dtype, what=f"optimizer state {slot_name!r}")
        device = self._state_device(param, slot_name)

        def create(value: np.ndarray) -> Trackable:
            tensor = tensor_from_numpy(np.array(value, copy=True), dtype).to(device)
            self._optimizer.state[param][slot_name] = tensor
            return self._slot_adapter(param, slot_name, tensor, variable)

        return PendingSlot(shape, numpy_dtype, create, what=f"optimizer state {slot_name!r}")

    def _defer_slot_variable(
        self, slot_variable_position: DeferredRestoration, variable: Trackable, slot_name: str
    ) -> None:
        # docstring inherited: torch creates its state in step(), nothing can wait for add_slot
        return None
