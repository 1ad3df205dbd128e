"""Restoring into torch tensors in place: the checks, then the copies, many at a time.

A restored value is copied into the tensor's own storage under ``torch.no_grad()``
(``tensor.copy_``), so the object, its device, ``requires_grad`` and every reference an
optimizer holds stay the same (semantics B3), and it is checked against the live shape and dtype
first (B8). A restore of many tensors checks the usual case a list at a time and copies the CPU
tensors in one ``torch._foreach_copy_``, under one ``no_grad`` and at most one warnings context.
"""

from __future__ import annotations

import functools
import itertools
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.torch_dtypes import (
    _DIRECT,
    _NUMPY_BY_TORCH,
    _VIEWED,
    _check_storable,
    numpy_dtype_for,
)
from trackpoint.tracking.base import VARIABLE_VALUE_KEY

__all__ = ["check_restorable", "copy_into", "copy_many", "prepare_copy", "tensor_from_numpy"]

_READ_ONLY_WARNING = "The given NumPy array is not writable"

# torch warns about a read-only array once per process (TORCH_WARN_ONCE): once that warning has
# been given, and silenced, here, ``from_numpy`` needs no warnings context (10 µs per value).
_read_only_warning_spent = False


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``torch.from_numpy``, as a tensor of ``dtype`` (bfloat16/float8 through an integer
    view); the caller silences the read-only warning."""
    viewed = _VIEWED.get(dtype)
    if viewed is not None:
        return torch.from_numpy(array.view(_DIRECT[viewed[0]])).view(dtype)
    return torch.from_numpy(array)


def _tensors_from_numpy(
    arrays: Sequence[np.ndarray], dtypes: Sequence[torch.dtype]
) -> list[torch.Tensor]:
    """:func:`tensor_from_numpy` of each pair, under at most one warnings context."""
    global _read_only_warning_spent
    if _read_only_warning_spent:
        return list(map(_from_numpy, arrays, dtypes))
    with warnings.catch_warnings():
        # Read-only views of the checkpoint are only read from, never written.
        warnings.filterwarnings("ignore", message=_READ_ONLY_WARNING)
        sources = list(map(_from_numpy, arrays, dtypes))
    if any(not array.flags.writeable for array in arrays):
        _read_only_warning_spent = True
    return sources


def tensor_from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` sharing ``array``'s memory, which may be a read-only view of
    a checkpoint file: read from it, never write (bfloat16/float8 go through an integer view).
    """
    return _tensors_from_numpy((array,), (dtype,))[0]


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


def _checked_copy(tensor: torch.Tensor, saved: Any, what: str) -> np.ndarray:
    """``saved`` as an array that :func:`copy_many` can copy into ``tensor`` (see prepare_copy)."""
    _check_storable(tensor, what)
    array = check_restorable(tensor, saved, what=what)
    _check_writable(tensor, what)
    return array


def prepare_copy(tensor: torch.Tensor, saved: Any, *, what: str = "tensor") -> Callable[[], None]:
    """Check that ``saved`` fits ``tensor``; return the step that copies it in (see copy_into).

    Raises:
        InvalidArgumentError: shape or dtype differ, or the tensor cannot hold checkpoint
            values.
    """
    array = _checked_copy(tensor, saved, what)
    return functools.partial(copy_many, (tensor,), (array,))


_foreach_copy = getattr(torch, "_foreach_copy_", None)


def copy_many(tensors: Sequence[torch.Tensor], arrays: Sequence[np.ndarray]) -> None:
    """Copy each array into its tensor in place, checked before (:func:`prepare_copy`'s checks).

    One ``torch.no_grad()`` and at most one warnings context for them all, and the CPU tensors
    in one ``torch._foreach_copy_`` (a C++ loop of ``copy_``: the same copies, the version
    counters move, no autograd history); with a tensor on another device, one by one.
    """
    if not tensors:
        return
    sources = _tensors_from_numpy(arrays, [tensor.dtype for tensor in tensors])
    if len(tensors) == 1:  # one object's step (the per-object path)
        with torch.no_grad():
            tensors[0].copy_(sources[0])
        return
    with torch.no_grad():
        if _foreach_copy is not None and all(tensor.is_cpu for tensor in tensors):
            _foreach_copy(list(tensors), sources)
            return
        for tensor, source in zip(tensors, sources, strict=True):
            tensor.copy_(source)


_TENSOR = operator.attrgetter("_tensor")
_SAVED = operator.itemgetter(VARIABLE_VALUE_KEY)
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_LAYOUT = operator.attrgetter("layout")
_IS_NESTED = operator.attrgetter("is_nested")
_IS_META = operator.attrgetter("is_meta")
_IS_INFERENCE = operator.methodcaller("is_inference")
_STRIDE = operator.methodcaller("stride")
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def _usual_copies(tensors: list[torch.Tensor], saved: list[Any]) -> list[bool] | None:
    """Which pairs pass every check of ``_checked_copy`` on sight, tested a list at a time (a
    model of 100,000 tensors): a plain tensor or parameter, dense, of a bundle dtype, not
    nested, meta or inference, no two elements in one place; an ndarray of its shape and
    numpy dtype. None: every pair does. A pair not passed here is checked one by one."""
    dtypes = list(map(_DTYPE, tensors))
    numpy_dtypes = list(map(_NUMPY_BY_TORCH.get, dtypes))
    if (  # (None, a dtype without a bundle dtype, must not meet float64: np.dtype(None) is)
        None not in numpy_dtypes
        and _PLAIN_TENSORS.issuperset(map(type, tensors))
        and set(map(type, saved)) == {np.ndarray}
        and list(map(_DTYPE, saved)) == numpy_dtypes
        and list(map(_SHAPE, saved)) == list(map(_SHAPE, tensors))
        and set(map(_LAYOUT, tensors)) == {torch.strided}
        and not any(map(_IS_NESTED, tensors)) and not any(map(_IS_META, tensors))
        and not any(map(_IS_INFERENCE, tensors))
        and not any(map(operator.contains, map(_STRIDE, tensors), itertools.repeat(0)))
    ):
        return None  # (a stride of 0 is refused only with more than one element: asked below)
    return list(map(_usual_copy, tensors, saved))


def _usual_copy(tensor: torch.Tensor, saved: Any) -> bool:
    """:func:`_usual_copies` of one pair."""
    numpy_dtype = _NUMPY_BY_TORCH.get(tensor.dtype)
    return (
        numpy_dtype is not None and type(tensor) in _PLAIN_TENSORS
        and type(saved) is np.ndarray
        and saved.dtype == numpy_dtype and saved.shape == tensor.shape
        and tensor.layout == torch.strided and not tensor.is_nested and not tensor.is_meta
        and not tensor.is_inference() and 0 not in tensor.stride()
    )
