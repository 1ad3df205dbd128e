"""Sample dtypes and arrays shared by the bundle tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from trackpoint.bundle.entries import make_entry
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleHeaderProto
from trackpoint.bundle.table_batch import table_of_pairs

# Every numeric dtype the bundle writes, with its TensorFlow DataType name.
NUMERIC_DTYPES: list[tuple[str, np.dtype]] = [
    ("DT_BOOL", np.dtype(bool)),
    ("DT_INT8", np.dtype(np.int8)),
    ("DT_INT16", np.dtype(np.int16)),
    ("DT_INT32", np.dtype(np.int32)),
    ("DT_INT64", np.dtype(np.int64)),
    ("DT_UINT8", np.dtype(np.uint8)),
    ("DT_UINT16", np.dtype(np.uint16)),
    ("DT_UINT32", np.dtype(np.uint32)),
    ("DT_UINT64", np.dtype(np.uint64)),
    ("DT_HALF", np.dtype(np.float16)),
    ("DT_FLOAT", np.dtype(np.float32)),
    ("DT_DOUBLE", np.dtype(np.float64)),
    ("DT_COMPLEX64", np.dtype(np.complex64)),
    ("DT_COMPLEX128", np.dtype(np.complex128)),
    ("DT_BFLOAT16", np.dtype(ml_dtypes.bfloat16)),
    ("DT_FLOAT8_E5M2", np.dtype(ml_dtypes.float8_e5m2)),
    ("DT_FLOAT8_E4M3FN", np.dtype(ml_dtypes.float8_e4m3fn)),
    ("DT_FLOAT8_E4M3FNUZ", np.dtype(ml_dtypes.float8_e4m3fnuz)),
    ("DT_FLOAT8_E4M3B11FNUZ", np.dtype(ml_dtypes.float8_e4m3b11fnuz)),
    ("DT_FLOAT8_E5M2FNUZ", np.dtype(ml_dtypes.float8_e5m2fnuz)),
    ("DT_INT4", np.dtype(ml_dtypes.int4)),
    ("DT_UINT4", np.dtype(ml_dtypes.uint4)),
    ("DT_INT2", np.dtype(ml_dtypes.int2)),
    ("DT_UINT2", np.dtype(ml_dtypes.uint2)),
    ("DT_FLOAT4_E2M1FN", np.dtype(ml_dtypes.float4_e2m1fn)),
]


def sample(dtype: np.dtype, shape: tuple[int, ...] = (2, 3), seed: int = 0) -> np.ndarray:
    """Deterministic values representable in ``dtype`` (small ints, exact in every type)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if dtype.kind == "b":
        return (rng.integers(0, 2, count) == 1).reshape(shape)
    low = 0 if dtype.kind == "u" or "uint" in dtype.name else -1
    values = rng.integers(low, 2, count).astype(np.float64)
    if dtype.kind == "c":
        values = values + 1j * rng.integers(-1, 2, count)
    return values.astype(dtype).reshape(shape)


def hand_built(prefix: str, header: BundleHeaderProto, tensors: list[tuple]) -> None:
    """Write a bundle from (key, datatype, shape, raw bytes, crc) without BundleWriter."""
    data = b""
    entries = {}
    for key, datatype, shape, raw, crc in tensors:
        entries[key.encode()] = make_entry(
            datatype, shape, offset=len(data), size=len(raw), crc32c=crc
        )
        data += raw
    rows = [(key, entries[key].SerializeToString()) for key in sorted(entries)]
    with open(f"{prefix}.index", "wb") as f:
        f.write(table_of_pairs([(b"", header.SerializeToString()), *rows]))
    with open(f"{prefix}.data-00000-of-00001", "wb") as f:
        f.write(data)
