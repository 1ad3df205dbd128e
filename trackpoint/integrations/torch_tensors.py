"""Torch tensors as checkpoint values: dtypes, zero-copy host views, in-place restore.

Every torch dtype with a bundle dtype round-trips (tf-checkpoint-format.md §5.2): the numeric
types numpy knows directly, and bfloat16/float8 through ``ml_dtypes`` by viewing the tensor as
an integer type of the same width (``.view(torch.int16)`` → numpy → ``.view(ml_dtypes...)``),
which copies nothing on CPU. Tensors numpy cannot describe (quantized, sparse, nested, meta,
complex32, packed sub-byte types) are refused with a message naming the tensor and its dtype.

Restoring copies into the tensor's own storage under ``torch.no_grad()`` (``tensor.copy_``),
so the object, its device, ``requires_grad`` and every reference an optimizer holds stay the
same (semantics B3), and the saved value is checked against the live shape and dtype first (B8).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.nn.parameter import is_lazy

from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.saving.devices import DeviceValue
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.state_json import array_from_json, array_to_json

__all__ = [
    "TENSOR_JSON_HOOKS",
    "TensorVariable",
    "check_restorable",
    "copy_into",
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

# torch dtype -> numpy dtype, for dtypes torch converts to numpy itself.
_DIRECT: dict[torch.dtype, np.dtype[Any]] = {
    torch.bool: np.dtype(np.bool_),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
for _name in ("uint16", "uint32", "uint64"):  # torch >= 2.3 converts these to numpy
    if hasattr(torch, _name):
        _DIRECT[getattr(torch, _name)] = np.dtype(_name)

# torch dtype -> (integer torch dtype of the same width, ml_dtypes numpy dtype).
_VIEWED: dict[torch.dtype, tuple[torch.dtype, np.dtype[Any]]] = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name) and hasattr(ml_dtypes, _name):
        _VIEWED[getattr(torch, _name)] = (torch.uint8, np.dtype(getattr(ml_dtypes, _name)))

_TORCH_BY_NUMPY: dict[np.dtype[Any], torch.dtype] = {
    **{numpy: torch_ for torch_, numpy in _DIRECT.items()},
    **{numpy: torch_ for torch_, (_, numpy) in _VIEWED.items()},
}

_SUPPORTED = (
    "bool, int8/16/32/64, uint8/16/32/64, float16/32/64, bfloat16, complex64/128 and "
    "float8_e4m3fn/e5m2(/fnuz)"
)


def numpy_dtype_for(dtype: torch.dtype, *, what: str = "tensor") -> np.dtype[Any]:
    """The numpy dtype a tensor of ``dtype`` is stored as.

    Raises:
        InvalidArgumentError: ``dtype`` has no bundle dtype (complex32, quantized, packed
            sub-byte types, float8_e8m0fnu...).
    """
    found = _DIRECT.get(dtype)
    if found is not None:
        return found
    viewed = _VIEWED.get(dtype)
    if viewed is not None:
        return viewed[1]
    raise InvalidArgumentError(
        f"{what} has dtype {dtype}, which TensorFlow checkpoints cannot store; supported torch "
        f"dtypes are {_SUPPORTED}. Convert it (e.g. tensor.to(torch.float32)) or keep it out "
        "of the checkpoint"
    )


def torch_dtype_for(dtype: np.dtype[Any], *, what: str = "value") -> torch.dtype:
    """The torch dtype of a stored numpy dtype (inverse of :func:`numpy_dtype_for`).

    Raises:
        InvalidArgumentError: torch has no such dtype (e.g. strings, int4).
    """
    found = _TORCH_BY_NUMPY.get(np.dtype(dtype).newbyteorder("="))
    if found is None:
        raise InvalidArgumentError(
            f"{what} has numpy dtype {np.dtype(dtype)}, which has no torch equivalent; "
            f"torch tensors hold {_SUPPORTED}"
        )
    return found


def is_uninitialized(tensor: torch.Tensor) -> bool:
    """True for a lazy module's parameter or buffer before its first forward pass."""
    return is_lazy(tensor)


def _check_storable(tensor: torch.Tensor, what: str) -> None:
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(
            f"{what} is a {tensor.layout} tensor (dtype {tensor.dtype}); only dense (strided) "
            "tensors can be checkpointed: save tensor.to_dense() instead"
        )
    if tensor.is_quantized:
        raise InvalidArgumentError(
            f"{what} is a quantized tensor (dtype {tensor.dtype}), which TensorFlow checkpoints "
            "cannot store; save tensor.dequantize() (and the scale/zero point) instead"
        )
    if getattr(tensor, "is_nested", False):
        raise InvalidArgumentError(
            f"{what} is a nested tensor (dtype {tensor.dtype}); save its components "
            "(tensor.unbind()) instead"
        )
    if tensor.is_meta:
        raise InvalidArgumentError(
            f"{what} is on the meta device (dtype {tensor.dtype}) and has no data to save; "
            "materialize it (module.to_empty(device=...)) first"
        )
    numpy_dtype_for(tensor.dtype, what=what)


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


def tensor_from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` sharing ``array``'s memory, which may be a read-only view of
    a checkpoint file: read from it, never write (bfloat16/float8 go through an integer view).
    """
    viewed = _VIEWED.get(dtype)
    if viewed is not None:
        array = array.view(_DIRECT[viewed[0]])
    with warnings.catch_warnings():
        # Read-only views of the checkpoint are only read from, never written.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        source = torch.from_numpy(array)
    return source.view(dtype) if viewed is not None else source


def check_restorable(
    tensor: torch.Tensor, saved: Any, *, what: str, shape: tuple[int, ...] | None = None
) -> np.ndarray:
    """``saved`` as an array, validated against ``tensor``'s dtype and shape.

    Raises:
        InvalidArgumentError: shape or dtype differ (TF's "incompatible tensor with shape"
            wording); nothing is written.
    """
    array = np.asarray(saved)
    expected_shape = tuple(tensor.shape) if shape is None else shape
    if array.shape != expected_shape:
        raise InvalidArgumentError(
            f"Received incompatible tensor with shape {array.shape} when attempting to restore "
            f"{what} with shape {expected_shape}; the checkpoint does not match the program "
            "(build the model with the saved shapes)"
        )
    expected = numpy_dtype_for(tensor.dtype, what=what)
    if array.dtype.newbyteorder("=") != expected:
        raise InvalidArgumentError(
            f"Received tensor of dtype {array.dtype} when attempting to restore {what} of torch "
            f"dtype {tensor.dtype} ({expected}); trackpoint does not cast on restore (create the "
            "tensor with the saved dtype, or cast after restoring)"
        )
    return array


def copy_into(tensor: torch.Tensor, saved: Any, *, what: str = "tensor") -> None:
    """Copy ``saved`` into ``tensor`` in place (same object, device, ``requires_grad``).

    Runs under ``torch.no_grad()``, so the copy leaves no autograd history; the tensor's
    version counter moves, so autograd notices if a pending graph had saved the old value.

    Raises:
        InvalidArgumentError: shape or dtype differ, or the tensor cannot hold checkpoint
            values; ``tensor`` is unchanged.
    """
    prepare_copy(tensor, saved, what=what)()


def _check_writable(tensor: torch.Tensor, what: str) -> None:
    """Refuse, before any object changes, a tensor that ``copy_`` would refuse mid-apply."""
    if tensor.is_inference() and not torch.is_inference_mode_enabled():
        raise InvalidArgumentError(
            f"cannot restore {what} in place: it is an inference tensor (made under "
            "torch.inference_mode()), which cannot be updated outside inference mode; restore "
            "into a normal tensor (tensor.clone() outside inference mode)"
        )
    if tensor.numel() > 1 and any(
        stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape)
    ):
        raise InvalidArgumentError(
            f"cannot restore {what} in place: several of its elements share one memory "
            f"location (an expanded view, strides {tuple(tensor.stride())}); restore into "
            "tensor.clone() instead"
        )


def prepare_copy(tensor: torch.Tensor, saved: Any, *, what: str = "tensor") -> Callable[[], None]:
    """Check that ``saved`` fits ``tensor``; return the step that copies it in (see copy_into).

    Raises:
        InvalidArgumentError: shape or dtype differ, or the tensor cannot hold checkpoint
            values.
    """
    _check_storable(tensor, what)
    array = check_restorable(tensor, saved, what=what)
    _check_writable(tensor, what)

    def apply() -> None:
        source = tensor_from_numpy(array, tensor.dtype)
        with torch.no_grad():
            tensor.copy_(source)

    return apply


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


class TensorVariable(Trackable):
    """Adapter: a ``torch.Tensor`` (``Parameter``, buffer, optimizer state) as a variable.

    Saves ``VARIABLE_VALUE`` (a zero-copy view on CPU; a host copy taken at snapshot time for
    device tensors) and restores in place. A lazy module's uninitialized parameter keeps a
    restored value until the module materializes it (see ``torch_modules``).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._name: str | None = None
        self._pending: np.ndarray | None = None
        self._on_pending: Callable[[], None] | None = None

    @property
    def tensor(self) -> torch.Tensor:
        """The live tensor (restores write into it)."""
        return self._tensor

    @property
    def name(self) -> str:
        """Where the tensor lives, e.g. ``"parameter '0.weight'"`` (used in messages)."""
        return self._name or f"tensor of shape {list(self._tensor.shape)}"

    def set_name(self, name: str) -> None:
        """Name the tensor for messages, unless an earlier owner already did (tied weights)."""
        if self._name is None:
            self._name = name

    def __repr__(self) -> str:
        return f"<torch {self.name} {self._tensor.dtype} {list(self._tensor.shape)}>"

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

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved = restored_tensors[VARIABLE_VALUE_KEY]
        tensor = self._tensor
        if not is_uninitialized(tensor):
            return prepare_copy(tensor, saved, what=self.name)
        array = np.asarray(saved)
        # Shape is checked at materialization; the dtype is known now.
        check_restorable(tensor, array, what=self.name, shape=array.shape)

        def keep_pending() -> None:
            self._pending = np.array(array, copy=True)  # the view dies with the restore
            if self._on_pending is not None:
                self._on_pending()

        return keep_pending
