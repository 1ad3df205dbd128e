"""``torch.nn.Module`` as a node of the object graph.

A module's children are its parameters, persistent buffers and submodules under their
attribute names, in ``state_dict`` order, so ``model.0.weight`` in a state_dict is
``model/0/weight/.ATTRIBUTES/VARIABLE_VALUE`` in a checkpoint. A parameter shared by two
modules (tied weights) is one node reached by two edges: saved once, restored once into the
one ``Parameter`` object both modules hold.

Deferred restoration (semantics B1) has two torch-specific triggers:

* a submodule, parameter or buffer registered after the restore (``model.head = nn.Linear(...)``)
  is restored as it is registered, through torch's global registration hooks;
* a lazy module's uninitialized parameters (``nn.LazyLinear``) keep the restored values until
  the first forward pass materializes them; forward pre-hooks around the module's own
  ``_infer_parameters`` hook copy the values in and put the RNG back where it was, so the
  throw-away random initialization does not shift the random stream of a resumed run.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.nn.modules import module as module_lib

from trackpoint.integrations.torch_tensors import (
    TENSOR_JSON_HOOKS,
    TensorVariable,
    is_uninitialized,
    tensor_to_json,
)
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import DeferredRestoration, Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = ["EXTRA_STATE_NAME", "ExtraState", "ModuleAdapter", "install_registration_hooks"]

EXTRA_STATE_NAME = "_extra_state"
"""Local name of a module's ``get_extra_state()`` value (the state_dict key suffix)."""

# Registry of module adapters that have (or had) restorations waiting for a child, by id of
# the module; the global registration hooks look modules up here. Weak: an adapter nobody
# holds has no restorations worth keeping.
_waiting: weakref.WeakValueDictionary[int, ModuleAdapter] = weakref.WeakValueDictionary()


class ExtraState(PythonState):
    """A module's ``get_extra_state()``/``set_extra_state()`` value, stored as JSON."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        self._module = module
        self._name = name

    def serialize(self) -> bytes:
        # docstring inherited
        state = self._module.get_extra_state()
        return dumps(state, what=f"extra state of {self._name}", default=tensor_to_json)

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        what = f"extra state of {self._name}"
        state = loads(data, what=what, hooks=TENSOR_JSON_HOOKS)
        return functools.partial(self._module.set_extra_state, state)

    def __repr__(self) -> str:
        return f"<torch extra state of {self._name}>"


def _has_extra_state(module: torch.nn.Module) -> bool:
    return type(module).get_extra_state is not torch.nn.Module.get_extra_state


class ModuleAdapter(Trackable):
    """Adapter: a ``torch.nn.Module`` whose children are its parameters, buffers, submodules.

    The adapter holds its children's adapters, so their restore bookkeeping lives as long as
    it does. The module itself is never modified except through in-place value copies.
    """

    # Name-based (TF1) checkpoints name the tensors below a module by their path under it, i.e.
    # their state_dict key with "." -> "/" (trackpoint.checkpoint.name_based).
    _name_based_scope = True

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module
        self._prefix = ""  # qualified name of this module inside the first module that owns it
        self._prefix_set = False
        self._children: dict[str, Trackable] = {}
        self._lazy_hooks: list[Any] | None = None

    @property
    def module(self) -> torch.nn.Module:
        return self._module

    def _set_prefix(self, prefix: str) -> None:
        if not self._prefix_set:
            self._prefix, self._prefix_set = prefix, True

    def _describe(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def __repr__(self) -> str:
        where = f" {self._prefix.rstrip('.')!r}" if self._prefix else ""
        return f"<torch module {type(self._module).__name__}{where}>"

    # -- children ------------------------------------------------------------------------------

    def _child(self, name: str, value: Any, kind: str) -> Trackable | None:
        cached = self._children.get(name)
        if cached is not None and (
            getattr(cached, "_self_adapted_value", None) is value
            or (isinstance(cached, ExtraState) and kind == "extra")
        ):
            return cached
        child = ExtraState(self._module, self._describe(name)) if kind == "extra" else (
            to_trackable(value)
        )
        if child is None:
            return None
        if isinstance(child, TensorVariable):
            child.set_name(f"{kind} '{self._describe(name)}'")
            if is_uninitialized(value):
                child.on_pending(self._install_lazy_hooks)
        elif isinstance(child, ModuleAdapter):
            child._set_prefix(f"{self._describe(name)}.")
        self._children[name] = child
        return child

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        module = self._module
        non_persistent = module._non_persistent_buffers_set
        entries: list[tuple[str, Any, str]] = [
            (name, p, "parameter") for name, p in module._parameters.items() if p is not None
        ]
        entries += [
            (name, b, "buffer") for name, b in module._buffers.items()
            if b is not None and name not in non_persistent
        ]
        if _has_extra_state(module):
            entries.append((EXTRA_STATE_NAME, None, "extra"))
        entries += [
            (name, m, "module") for name, m in module._modules.items() if m is not None
        ]
        children: dict[str, Trackable] = {}
        for name, value, kind in entries:
            child = self._child(name, value, kind)
            if child is not None:
                children[name] = child
        self._children = children
        return dict(children)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        if cached_dependencies is not None:
            return cached_dependencies.get(name)
        return self._trackable_children().get(name)

    @property
    def _deferred_dependencies(self) -> dict[str, list[DeferredRestoration]]:
        # A restore is about to wait for a child: make the registration hooks see this module.
        _waiting[id(self._module)] = self
        return super()._deferred_dependencies

    def _on_register(self, name: str, value: Any) -> None:
        """Torch is registering ``value`` as ``name`` on this module: restore it if awaited."""
        self._maybe_initialize_trackable()
        if not self._self_deferred.get(name):
            return
        kind = "module" if isinstance(value, torch.nn.Module) else "parameter"
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            kind = "buffer"
        child = self._child(name, value, kind)
        if child is not None:
            self._handle_deferred_dependencies(name, child)

    # -- lazy modules --------------------------------------------------------------------------

    def _pending_tensors(self) -> list[TensorVariable]:
        return [
            child for child in self._children.values()
            if isinstance(child, TensorVariable) and child.pending_value is not None
        ]

    def _install_lazy_hooks(self) -> None:
        """A child parameter got a value before materialization: wrap the first forward.

        The hooks hold this adapter (and so the waiting values) for as long as the module
        lives, even if the Checkpoint that restored them is dropped; they remove themselves
        once every value is applied.
        """
        if self._lazy_hooks is not None:
            return
        saved_rng: dict[str, Any] = {}

        def before(_module: torch.nn.Module, _args: Any) -> None:
            if self._all_uninitialized_pending():
                saved_rng.update(_rng_states(self._uninitialized_devices()))

        def after(_module: torch.nn.Module, _args: Any) -> None:
            try:
                self._apply_pending()
            finally:
                if saved_rng:
                    _set_rng_states(saved_rng)
                    saved_rng.clear()

        # ``before`` runs ahead of the lazy module's ``_infer_parameters`` (which initializes
        # the parameters randomly), ``after`` right after it.
        self._lazy_hooks = [
            self._module.register_forward_pre_hook(before, prepend=True),
            self._module.register_forward_pre_hook(after),
        ]

    def _all_uninitialized_pending(self) -> bool:
        lazy = [
            child for child in self._children.values()
            if isinstance(child, TensorVariable) and is_uninitialized(child.tensor)
        ]
        return bool(lazy) and all(child.pending_value is not None for child in lazy)

    def _uninitialized_devices(self) -> set[torch.device]:
        return {
            child.tensor.device for child in self._children.values()
            if isinstance(child, TensorVariable) and is_uninitialized(child.tensor)
        }

    def _apply_pending(self) -> None:
        """Copy waiting values into materialized tensors; drop the hooks once none wait."""
        for child in self._pending_tensors():
            if not is_uninitialized(child.tensor):
                child.apply_pending()
        if not self._pending_tensors() and self._lazy_hooks is not None:
            for handle in self._lazy_hooks:
                handle.remove()
            self._lazy_hooks = None


def _rng_states(devices: set[torch.device]) -> dict[str, Any]:
    states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    for device in devices:
        if device.type != "cpu":
            backend = getattr(torch, device.type, None)
            if backend is not None and hasattr(backend, "get_rng_state"):
                states[str(device)] = (backend, device, backend.get_rng_state(device))
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    for name, state in states.items():
        if name == "cpu":
            torch.set_rng_state(state)
        else:
            backend, device, value = state
            backend.set_rng_state(value, device)


def _on_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    """Global torch hook for every submodule/parameter/buffer registration (cheap when idle)."""
    if value is None:
        return None
    adapter = _waiting.get(id(module))
    if adapter is not None and adapter._module is module:
        adapter._on_register(name, value)
    return None


def install_registration_hooks() -> list[Any]:
    """Hook torch's global module/parameter/buffer registration (done once, at import)."""
    return [
        module_lib.register_module_module_registration_hook(_on_registration),
        module_lib.register_module_parameter_registration_hook(_on_registration),
        module_lib.register_module_buffer_registration_hook(_on_registration),
    ]
