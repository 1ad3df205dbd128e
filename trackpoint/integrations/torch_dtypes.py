"""Which torch tensors a checkpoint holds, and as which numpy dtype (tf-checkpoint-format.md §5.2).

The numeric types numpy knows directly, and bfloat16/float8 through ``ml_dtypes`` by viewing the
tensor as an integer type of the same width (``.view(torch.int16)`` → numpy →
``.view(ml_dtypes...)``), which copies nothing on CPU. Tensors numpy cannot describe
(quantized, sparse, nested, meta, complex32, packed sub-byte types) are refused with a message
naming the tensor and its dtype.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

from trackpoint.errors import InvalidArgumentError

__all__ = ["is_uninitialized", "numpy_dtype_for", "torch_dtype_for"]

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

_NUMPY_BY_TORCH: dict[torch.dtype, np.dtype[Any]] = {
    **_DIRECT, **{torch_: numpy for torch_, (_, numpy) in _VIEWED.items()}
}

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
    return isinstance(tensor, UninitializedTensorMixin)  # torch's is_lazy, without its call


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
