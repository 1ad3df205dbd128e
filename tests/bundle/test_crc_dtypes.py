"""crc32c/masking vectors (§2.2) and the DataType <-> numpy mapping (§5.2, I3)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from bundle_samples import NUMERIC_DTYPES

from trackpoint.bundle import crc
from trackpoint.bundle.dtypes import DataType, datatype_for, element_size, numpy_dtype_for
from trackpoint.bundle.protos import types_pb2
from trackpoint.errors import InvalidArgumentError


def test_crc32c_vectors():
    assert crc.crc32c(b"123456789") == 0xE3069283
    assert crc.crc32c(b"") == 0
    assert crc.extend(crc.crc32c(b"12345"), b"6789") == 0xE3069283
    assert crc.crc32c(np.frombuffer(b"123456789", np.uint8)) == 0xE3069283


def test_mask_vectors_and_inverse():
    assert crc.mask(0) == 0xA282EAD8
    assert crc.mask(0xE3069283) == 0xC78AB0E5
    assert crc.masked_crc32c(b"123456789") == 0xC78AB0E5
    for value in (0, 1, 0xFFFFFFFF, 0x12345678, 0x80000000):
        assert crc.unmask(crc.mask(value)) == value


def test_datatype_enum_matches_proto_descriptor():
    assert {d.name: d.value for d in DataType} == dict(types_pb2.DataType.items())


@pytest.mark.parametrize(("name", "dtype"), NUMERIC_DTYPES, ids=[n for n, _ in NUMERIC_DTYPES])
def test_numeric_dtype_round_trip(name, dtype):
    datatype = datatype_for(dtype)
    assert datatype.name == name
    assert numpy_dtype_for(datatype) == dtype
    assert element_size(datatype) == dtype.itemsize


def test_byte_order_and_aliases_map_to_same_type():
    assert datatype_for(np.dtype(">f4")) == DataType.DT_FLOAT
    assert datatype_for(np.dtype("q")) == datatype_for(np.dtype("l")) == DataType.DT_INT64


@pytest.mark.parametrize("dtype", ["S4", "U3", object])
def test_string_like_dtypes_are_dt_string(dtype):
    assert datatype_for(np.dtype(dtype)) == DataType.DT_STRING
    assert numpy_dtype_for(DataType.DT_STRING) == np.dtype(object)
    assert element_size(DataType.DT_STRING) is None


@pytest.mark.parametrize(
    "dtype",
    ["M8[s]", "m8[s]", "V4", [("a", "i4")], np.longdouble, ml_dtypes.float8_e4m3, ml_dtypes.int1],
)
def test_unsupported_dtypes_raise_naming_key(dtype):
    with pytest.raises(InvalidArgumentError, match="Unsupported dtype .* for key 'w'"):
        datatype_for(np.dtype(dtype), key="w")


@pytest.mark.parametrize(
    "datatype", [DataType.DT_VARIANT, DataType.DT_RESOURCE, DataType.DT_INVALID, 101, 999]
)
def test_undecodable_datatypes_raise(datatype):
    with pytest.raises(InvalidArgumentError, match="no numpy equivalent"):
        numpy_dtype_for(datatype, key="k")


def test_quantized_read_as_integers():
    assert numpy_dtype_for(DataType.DT_QINT8) == np.int8
    assert numpy_dtype_for(DataType.DT_QUINT16) == np.uint16
    assert numpy_dtype_for(DataType.DT_QINT32) == np.int32


def test_int4_layout_matches_tensorflow():
    # §5.2: one element per byte, value in the low nibble (-3 -> 0x0d).
    assert np.array([-3], ml_dtypes.int4).view(np.uint8)[0] == 0x0D
