"""Torch tensors as checkpoint values: zero-copy host views, the tensor adapter, JSON state.

A CPU tensor is saved as a zero-copy numpy view of its memory (bfloat16/float8 through an
integer view, ``torch_dtypes``); a device tensor as a host copy taken when the saver evaluates
it. :class:`TensorVariable` restores in place (``torch_copy``: checked, then copied, many
tensors at a time). Small tensors inside JSON state (a learning rate) are tagged dicts.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np
import torch

from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.integrations.torch_copy import (
    _PLAIN_TENSORS,
    _SAVED,
    _TENSOR,
    _checked_copy,
    _usual_copies,
    _usual_copy,
    check_restorable,
    copy_into,
    copy_many,
    prepare_copy,
    tensor_from_numpy,
)
from trackpoint.integrations.torch_dtypes import (
    _DIRECT,
    _VIEWED,
    _check_storable,
    is_uninitialized,
    numpy_dtype_for,
    torch_dtype_for,
)
from trackpoint.saving.devices import DeviceValue
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.state_json import array_from_json, array_to_json

__all__ = [
    "TENSOR_JSON_HOOKS",
    "TensorVariable",
    "check_restorable",
    "copy_into",
    "copy_many",
    "host_copy",
    "is_uninitialized",
    "numpy_dtype_for",
    "prepare_copy",
    "tensor_from_json",
    "tensor_from_numpy",
    "tensor_to_json",
    "to_numpy",
    "torch_dtype_for",
]

def host_copy(tensor: torch.Tensor, *, pin_memory: bool | None = None) -> torch.Tensor:
    """A CPU copy of ``tensor``, taken through pinned memory when an accelerator is present.

    The copy is issued ``non_blocking`` into a page-locked buffer (the fast DMA path) and waited
    for on ``tensor``'s device only, so it is complete on return. The same code runs on any
    device; on a CPU-only machine it is a plain copy.

    Args:
        tensor: any dense tensor.
        pin_memory: use a page-locked buffer; default: when an accelerator is available.
    """
    if pin_memory is None:
        pin_memory = tensor.device.type != "cpu" and torch.accelerator.is_available()
    buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin_memory)
    buffer.copy_(tensor.detach(), non_blocking=pin_memory)
    if pin_memory and tensor.device.type != "cpu":
        torch.accelerator.synchronize(tensor.device)
    return buffer


def to_numpy(tensor: torch.Tensor, *, what: str = "tensor") -> np.ndarray:
    """``tensor``'s value as a numpy array: a zero-copy view for CPU tensors.

    Non-CPU tensors are copied to host memory (:func:`host_copy`); conjugate/negative views
    are resolved (a copy). Strided views stay strided: the bundle writer handles them.

    Raises:
        InvalidArgumentError: the tensor cannot be stored (names ``what`` and the dtype).
    """
    _check_storable(tensor, what)
    value = tensor.detach()
    if value.device.type != "cpu":
        value = host_copy(value)
    if value.is_conj():
        value = value.resolve_conj()
    if value.is_neg():
        value = value.resolve_neg()
    viewed = _VIEWED.get(value.dtype)
    if viewed is not None:
        return value.view(viewed[0]).numpy().view(viewed[1])
    return value.numpy()


_TENSOR_TAG = "__torch_tensor__"


def tensor_to_json(value: Any) -> dict[str, Any] | None:
    """A small tensor inside JSON state (a learning rate, a scheduler value) as a tagged dict;
    None for anything that is not a tensor (``state_json.dumps``'s ``default`` hook)."""
    if not isinstance(value, torch.Tensor):
        return None
    what = f"tensor of dtype {value.dtype} in JSON state"
    return {
        _TENSOR_TAG: {
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "requires_grad": bool(value.requires_grad),
            "value": array_to_json(to_numpy(value, what=what), what=what),
        }
    }


def tensor_from_json(spec: Mapping[str, Any]) -> torch.Tensor:
    """The tensor :func:`tensor_to_json` encoded, on its device if this process has it."""
    what = "tensor in JSON state"
    try:
        dtype = getattr(torch, spec["dtype"])
        array = array_from_json(spec["value"], what=what)
        device = torch.device(spec.get("device", "cpu"))
    except (KeyError, TypeError, AttributeError, RuntimeError) as exc:
        raise InvalidArgumentError(f"malformed {what}: {exc}") from exc
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgumentError(f"malformed {what}: {spec['dtype']!r} is not a torch dtype")
    tensor = tensor_from_numpy(array, dtype).clone()
    if device.type != "cpu":
        try:
            tensor = tensor.to(device)
        except (RuntimeError, AssertionError):
            pass  # no such device here: keep it on the CPU, callers copy it where it belongs
    if spec.get("requires_grad") and (tensor.is_floating_point() or tensor.is_complex()):
        tensor.requires_grad_(True)
    return tensor


TENSOR_JSON_HOOKS = {_TENSOR_TAG: tensor_from_json}
"""``state_json.loads`` hooks that turn :func:`tensor_to_json` tags back into tensors."""


def _plain_on_host(tensor: torch.Tensor) -> bool:
    """Whether :func:`to_numpy` of ``tensor`` is ``tensor.detach().numpy()``: a dense CPU
    tensor of a numpy dtype, nothing to refuse or resolve (the common tensor, answered fast)."""
    return (
        type(tensor) in _PLAIN_TENSORS and tensor.is_cpu and tensor.dtype in _DIRECT
        and tensor.layout == torch.strided and not tensor.is_nested
        and not tensor.is_conj() and not tensor.is_neg()
    )


class TensorVariable(Trackable):
    """Adapter: a ``torch.Tensor`` (``Parameter``, buffer, optimizer state) as a variable.

    Saves ``VARIABLE_VALUE`` (a zero-copy view on CPU; a host copy taken at snapshot time for
    device tensors) and restores in place. A lazy module's uninitialized parameter keeps a
    restored value until the module materializes it (see ``torch_modules``).
    """

    # Its one value, always read whole: a device tensor's DeviceValue names the device the saver
    # copies from (a restore reads it as any whole value), a lazy tensor's callable is the
    # save-time error; neither is a layout a restore reads by.
    _whole_value_names: ClassVar[tuple[str, ...] | None] = (VARIABLE_VALUE_KEY,)

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._name: str | Callable[[], str] | None = None
        self._pending: np.ndarray | None = None
        self._on_pending: Callable[[], None] | None = None

    @property
    def tensor(self) -> torch.Tensor:
        """The live tensor (restores write into it)."""
        return self._tensor

    @property
    def name(self) -> str:
        """Where the tensor lives, e.g. ``"parameter '0.weight'"`` (used in messages)."""
        name = self._name
        if name is not None:
            return name if isinstance(name, str) else name()
        if is_uninitialized(self._tensor):  # has no shape to tell yet
            return "uninitialized lazy tensor"
        return f"tensor of shape {list(self._tensor.shape)}"

    def set_name(self, name: str | Callable[[], str]) -> None:
        """Name the tensor for messages, unless an earlier owner already did (tied weights);
        ``name`` may be a function that names it when a message asks (its owner's name may not
        be known yet)."""
        if self._name is None:
            self._name = name

    def __repr__(self) -> str:
        shape = "" if is_uninitialized(self._tensor) else f" {list(self._tensor.shape)}"
        return f"<torch {self.name} {self._tensor.dtype}{shape}>"

    # -- lazy modules --------------------------------------------------------------------------

    @property
    def pending_value(self) -> np.ndarray | None:
        """A restored value waiting for the tensor to be materialized (lazy modules), or None."""
        return self._pending

    def apply_pending(self) -> None:
        """Copy a waiting restored value into the now materialized tensor.

        Raises:
            InvalidArgumentError: the materialized shape differs from the saved one.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            copy_into(self._tensor, pending, what=self.name)

    def on_pending(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` when a value starts waiting (the owning module installs hooks)."""
        self._on_pending = callback

    # -- checkpointing -------------------------------------------------------------------------

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        tensor = self._tensor
        if _plain_on_host(tensor):
            return {VARIABLE_VALUE_KEY: tensor.detach().numpy()}
        if is_uninitialized(tensor):
            if self._pending is not None:
                return {VARIABLE_VALUE_KEY: self._pending}
            return {VARIABLE_VALUE_KEY: self._uninitialized_error}
        if tensor.device.type == "cpu":
            return {VARIABLE_VALUE_KEY: to_numpy(tensor, what=self.name)}
        _check_storable(tensor, self.name)
        # Device tensors are copied to the host when the saver evaluates the value, once.
        return {
            VARIABLE_VALUE_KEY: DeviceValue(
                lambda: to_numpy(tensor, what=self.name), device=str(tensor.device)
            )
        }

    def _uninitialized_error(self) -> np.ndarray:
        raise FailedPreconditionError(
            f"{self.name} belongs to a lazy module that has not run its first forward pass, so "
            "it has no value to save yet; run one forward pass (or restore a checkpoint into "
            "it) before saving"
        )

    @classmethod
    def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
        # docstring inherited: host views of dense CPU tensors in one pass, the rest one by one
        out: list[dict[str, Any]] = []
        add = out.append
        for trackable in cast("Sequence[TensorVariable]", trackables):
            tensor = trackable._tensor
            if _plain_on_host(tensor):
                add({VARIABLE_VALUE_KEY: tensor.detach().numpy()})
            else:
                add(trackable._serialize_to_tensors())
        return out

    def _checked_value(self, restored_tensors: Mapping[str, Any]) -> np.ndarray:
        """The saved value as an array, checked against the tensor (shape, dtype, writable).

        Raises:
            InvalidArgumentError: it does not fit; nothing changed.
        """
        saved = restored_tensors[VARIABLE_VALUE_KEY]
        tensor = self._tensor
        if _usual_copy(tensor, saved):
            return saved  # type: ignore[no-any-return]  # an ndarray: _usual_copy checked
        if not is_uninitialized(tensor):
            return _checked_copy(tensor, saved, self.name)
        array = np.asarray(saved)
        # Shape is checked at materialization; the dtype is known now.
        check_restorable(tensor, array, what=self.name, shape=array.shape)
        return array

    def _keep_pending(self, array: np.ndarray) -> None:
        """Keep ``array`` until the lazy module materializes the tensor."""
        self._pending = np.array(array, copy=True)  # the view dies with the restore
        if self._on_pending is not None:
            self._on_pending()

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        array = self._checked_value(restored_tensors)
        if is_uninitialized(self._tensor):
            return functools.partial(self._keep_pending, array)
        return functools.partial(copy_many, (self._tensor,), (array,))

    @classmethod
    def _prepare_restores(
        cls,
        trackables: Sequence[Trackable],
        restored: Sequence[Mapping[str, Any]],
        on_error: Callable[[int, InvalidArgumentError], BaseException],
    ) -> Callable[[], None]:
        # docstring inherited: every value checked as _prepare_restore does, then one step
        # copies them all (copy_many: one no_grad, the CPU tensors in one foreach copy)
        variables = cast("Sequence[TensorVariable]", trackables)
        tensors: list[torch.Tensor] = list(map(_TENSOR, variables))
        arrays: list[np.ndarray] = list(map(_SAVED, restored))
        if len(arrays) != len(tensors):
            raise ValueError(f"{len(tensors)} tensors but {len(arrays)} values to restore")
        pending: list[tuple[TensorVariable, np.ndarray]] = []
        usual = _usual_copies(tensors, arrays)
        if usual is not None and not all(usual):
            # The rest one by one, checked (and refused) exactly as _prepare_restore does.
            for index in [i for i, ok in enumerate(usual) if not ok]:
                trackable = variables[index]
                try:
                    arrays[index] = trackable._checked_value(restored[index])
                except InvalidArgumentError as exc:
                    raise on_error(index, exc) from exc
                if is_uninitialized(trackable._tensor):
                    pending.append((trackable, arrays[index]))
            if pending:
                waiting = {id(trackable) for trackable, _ in pending}
                kept = [id(trackable) not in waiting for trackable in variables]
                tensors = list(itertools.compress(tensors, kept))
                arrays = list(itertools.compress(arrays, kept))

        def apply() -> None:
            copy_many(tensors, arrays)
            for trackable, array in pending:
                trackable._keep_pending(array)

        return apply
