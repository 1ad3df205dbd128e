"""The tensor bundle: ``.index`` table, data files, crc32c, dtypes, slices, merge, reader.

See DESIGN.md for what this layer owns and docs/tf-checkpoint-format.md for the bytes.
"""

from __future__ import annotations

from trackpoint.bundle.crc import crc32c, mask, masked_crc32c, unmask
from trackpoint.bundle.dtypes import DataType, datatype_for, element_size, numpy_dtype_for
from trackpoint.bundle.merge import merge_bundles
from trackpoint.bundle.naming import data_filename, index_filename
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import (
    TensorSlice,
    decode_slice_key,
    encode_slice_key,
    format_slice_spec,
    parse_slice_spec,
)
from trackpoint.bundle.writer import BundleWriter

__all__ = [
    "BundleReader",
    "BundleWriter",
    "DataType",
    "TensorSlice",
    "crc32c",
    "data_filename",
    "datatype_for",
    "decode_slice_key",
    "element_size",
    "encode_slice_key",
    "format_slice_spec",
    "index_filename",
    "mask",
    "masked_crc32c",
    "merge_bundles",
    "numpy_dtype_for",
    "parse_slice_spec",
    "unmask",
]
