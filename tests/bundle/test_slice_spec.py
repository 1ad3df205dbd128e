"""TensorSlice text forms, protos, geometry and OrderedCode keys (§7, §8.2, §8.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trackpoint.bundle.protos.tensor_slice_pb2 import TensorSliceProto
from trackpoint.bundle.slice_spec import (
    TensorSlice,
    _decode_signed,
    _signed_num_increasing,
    decode_slice_key,
    encode_slice_key,
    format_slice_spec,
    parse_slice_spec,
)
from trackpoint.errors import InvalidArgumentError

SIGNED_VECTORS = {
    0: "80",
    2: "82",
    63: "bf",
    64: "c0 40",
    -1: "7f",
    -64: "40",
    -65: "3f bf",
    8191: "df ff",
    8192: "e0 20 00",
    70000: "e1 11 70",
}


@pytest.mark.parametrize(("value", "encoded"), SIGNED_VECTORS.items())
def test_signed_num_increasing_vectors(value, encoded):
    raw = bytes.fromhex(encoded.replace(" ", ""))
    assert _signed_num_increasing(value) == raw
    assert _decode_signed(raw, 0) == (value, len(raw))


@given(st.integers(min_value=-(2**69), max_value=2**69 - 1))
def test_signed_num_increasing_round_trip_and_order(value):
    raw = _signed_num_increasing(value)
    assert _decode_signed(raw, 0) == (value, len(raw))
    assert (_signed_num_increasing(value + 1) > raw) if value + 1 < 2**69 else True


def test_slice_key_worked_examples():
    key = encode_slice_key("v/.ATTRIBUTES/VARIABLE_VALUE", TensorSlice((0, 0), (4, 2)))
    assert key == b"\x00v/.ATTRIBUTES/VARIABLE_VALUE\x00\x01\x01\x02\x80\x84\x80\x82"
    tail = encode_slice_key("a", TensorSlice.parse("70000,2:-"))[len(b"\x00a\x00\x01") :]
    assert tail == bytes.fromhex("01 02 e1 11 70 82 80 7f".replace(" ", ""))


@given(
    st.text(min_size=1, max_size=20),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(-1, 10**6)), max_size=5),
)
def test_slice_key_round_trip(name, extents):
    extents = [(0 if n == -1 else s, n) for s, n in extents]
    tensor_slice = TensorSlice(tuple(s for s, _ in extents), tuple(n for _, n in extents))
    assert decode_slice_key(encode_slice_key(name, tensor_slice)) == (name, tensor_slice)


def test_key_escapes_nul():
    key = encode_slice_key("a\x00b", TensorSlice.parse("-"))
    assert key.startswith(b"\x00a\x00\xffb\x00\x01")
    assert decode_slice_key(key)[0] == "a\x00b"


@pytest.mark.parametrize("bad", [b"", b"a", b"\x00abc", b"\x00a\x00\x01\x01\x01\x80"])
def test_decode_rejects_non_keys(bad):
    with pytest.raises(ValueError):  # noqa: PT011 - any malformed-key error
        decode_slice_key(bad)


def test_cpp_form_parse_and_format():
    assert TensorSlice.parse("-:0,2") == TensorSlice((0, 0), (-1, 2))
    assert str(TensorSlice((0, 3), (-1, 2))) == "-:3,2"
    assert TensorSlice.parse("") == TensorSlice((), ())
    for bad in ["0", "a,b", "-1,2", "0,0", "1,2,3", "-:"]:
        with pytest.raises(InvalidArgumentError):
            TensorSlice.parse(bad)


def test_python_spec_form():
    assert parse_slice_spec("4 6 0,4:0,2") == ((4, 6), TensorSlice((0, 0), (4, 2)))
    assert parse_slice_spec("") is None
    assert parse_slice_spec("  5 0,5 ") == ((5,), TensorSlice((0,), (5,)))
    assert parse_slice_spec("4 6 -:0,2") == ((4, 6), TensorSlice((0, 0), (-1, 2)))
    assert format_slice_spec((4, 6), TensorSlice((0, 0), (-1, 2))) == "4 6 0,4:0,2"
    for bad in ["0,4", "4 x 0,1:0,1", "4 6 0,5:0,2", "4 0,1:0,1"]:
        with pytest.raises(InvalidArgumentError):
            parse_slice_spec(bad)


def test_proto_form_matches_tensorflow_bytes():
    # §8.2: whole dim = empty Extent; start 0 omitted; length always present.
    assert TensorSlice.parse("0,4:-").to_proto().SerializeToString() == bytes.fromhex(
        "0a0210040a00"
    )
    proto = TensorSlice((2, 3), (2, 3)).to_proto()
    assert proto.SerializeToString() == bytes.fromhex("0a04080210020a0408031003")
    assert TensorSlice.from_proto(proto) == TensorSlice((2, 3), (2, 3))
    assert TensorSlice.from_proto(TensorSliceProto.FromString(b"\x0a\x00")) == TensorSlice(
        (0,), (-1,)
    )


def test_geometry():
    whole = TensorSlice.full(2)
    top = TensorSlice.parse("0,2:-")
    box = TensorSlice.parse("1,3:2,3")
    assert whole.is_full((5, 10))
    assert TensorSlice.parse("0,5:0,10").is_full((5, 10))
    assert not top.is_full((5, 10))
    assert top.shape_in((5, 10)) == (2, 10)
    assert top.intersect(box) == TensorSlice((1, 2), (1, 3))
    assert whole.intersect(top) == top
    assert whole.intersect(whole) == whole
    assert TensorSlice.parse("0,1:-").intersect(TensorSlice.parse("1,1:-")) is None
    assert box.relative_to(top, (5, 10)) == (slice(1, 4), slice(2, 5))
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        box.shape_in((3, 3))
    with pytest.raises(InvalidArgumentError, match="rank"):
        box.shape_in((5,))
    with pytest.raises(InvalidArgumentError):
        TensorSlice((1,), (-1,))
