"""BundleWriter.add_chunks: a tensor streamed in pieces is stored exactly as add() stores it."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.bundle import BundleReader, BundleWriter
from trackpoint.bundle.slice_spec import TensorSlice
from trackpoint.errors import InvalidArgumentError


def _bytes(prefix: str) -> tuple[bytes, bytes]:
    with open(prefix + ".index", "rb") as f, open(prefix + ".data-00000-of-00001", "rb") as g:
        return f.read(), g.read()


def _pieces(array: np.ndarray, size: int) -> list[np.ndarray]:
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return [flat[i : i + size] for i in range(0, flat.size, size)]


def test_chunked_tensors_and_slices_match_add(tmp_path) -> None:  # noqa: ANN001
    big = np.arange(50_000, dtype=np.float32).reshape(100, 500)
    small = np.arange(7, dtype=np.int64)
    full = np.arange(24.0).reshape(4, 6)
    upper, lower = TensorSlice.parse("0,2:-"), TensorSlice.parse("2,2:-")
    with BundleWriter(str(tmp_path / "plain")) as writer:
        writer.add("big", big)
        writer.add("small", small)
        writer.add_slice("p", (4, 6), upper, full[:2])
        writer.add_slice("p", (4, 6), lower, full[2:])
        writer.add_slice("whole", (4, 6), TensorSlice.full(2), full)
    with BundleWriter(str(tmp_path / "chunked")) as writer:
        writer.add_chunks("big", big.dtype, big.shape, _pieces(big, 70_001))
        writer.add_chunks("small", small.dtype, small.shape, iter(_pieces(small, 3)))
        writer.add_chunks("p", full.dtype, (2, 6), _pieces(full[:2], 40),
                          full_shape=(4, 6), tensor_slice=upper)
        writer.add_chunks("p", full.dtype, (2, 6), _pieces(full[2:], 1000),
                          full_shape=(4, 6), tensor_slice="2,2:-")
        writer.add_chunks("whole", full.dtype, (4, 6), _pieces(full, 64),
                          full_shape=(4, 6), tensor_slice=TensorSlice.full(2))
    assert _bytes(str(tmp_path / "chunked")) == _bytes(str(tmp_path / "plain"))
    with BundleReader(str(tmp_path / "chunked")) as reader:
        np.testing.assert_array_equal(reader.read("p"), full)


def test_add_chunks_rejects_wrong_sizes_strings_and_bad_slices(tmp_path) -> None:  # noqa: ANN001
    with BundleWriter(str(tmp_path / "b")) as writer:
        with pytest.raises(InvalidArgumentError, match="got 8 bytes, expected 12"):
            writer.add_chunks("a", np.float32, (3,), [b"\x00" * 8])
        with pytest.raises(InvalidArgumentError, match="string"):
            writer.add_chunks("s", np.dtype(object), (1,), [])
        with pytest.raises(InvalidArgumentError, match="has shape"):
            writer.add_chunks("p", np.float32, (3, 6), [], full_shape=(4, 6),
                              tensor_slice="0,2:-")
        with pytest.raises(InvalidArgumentError, match="full_shape"):
            writer.add_chunks("q", np.float32, (2, 6), [], tensor_slice="0,2:-")
        writer.add_chunks("ok", np.float32, (1,), [b"\x00\x00\x80\x3f"])
        with pytest.raises(InvalidArgumentError, match="duplicate key"):
            writer.add_chunks("ok", np.float32, (1,), [b"\x00\x00\x80\x3f"])
    with BundleReader(str(tmp_path / "b")) as reader:
        assert reader.read("ok").tolist() == [1.0]
