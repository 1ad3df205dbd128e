"""The index decodes all its keys in one pass: the same strings as decoding each key alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trackpoint.bundle.index import _decode_keys


@given(st.lists(st.binary(max_size=8), max_size=6))
def test_one_decode_equals_each_key_decoded(keys: list[bytes]) -> None:
    assert _decode_keys(keys) == [key.decode("utf-8", "surrogateescape") for key in keys]


def test_keys_holding_nul_or_broken_utf8_decode_alone() -> None:
    keys = [b"a\x00b", "é".encode()[:1], "/é/".encode(), b""]
    assert _decode_keys(keys) == [key.decode("utf-8", "surrogateescape") for key in keys]
