"""The table builder and reader (§3) against a reference of TensorFlow's steps, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import table_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_reference import reference_table as one_by_one

from trackpoint.bundle.entries import entry_head, entry_tail
from trackpoint.bundle.entry_batch import entry_columns
from trackpoint.bundle.table import _read_entries, _scan, read_table
from trackpoint.bundle.table_batch import Column, build_table
from trackpoint.errors import DataLossError, InvalidArgumentError


def in_one_pass(pairs: list[tuple[bytes, bytes]], block_size: int = 262144) -> bytes:
    keys = [key for key, _ in pairs]
    return build_table(keys, [Column.of_bytes([v for _, v in pairs])], block_size=block_size)


def scanned(data: bytes) -> list[tuple[bytes, bytes]]:
    table = read_table(data, "t.index")
    return [(key, table.value(i)) for i, key in enumerate(table.keys)]


# Keys with long shared prefixes and "/" (as checkpoint keys have), bytes of any value, and
# values from empty to longer than a 128-byte window and than a varint byte.
_keys = st.lists(
    st.one_of(
        st.binary(max_size=12),
        st.builds(lambda a, b: b"model/layer/" * a + b, st.integers(0, 14), st.binary(max_size=3)),
    ),
    max_size=150,
    unique=True,
).map(sorted)
_value = st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=400))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=_keys, data=st.data(), block_size=st.sampled_from([64, 300, 4096, 262144]))
def test_build_and_scan_agree_with_one_by_one(keys, data, block_size):
    values = data.draw(st.lists(_value, min_size=len(keys), max_size=len(keys)))
    pairs = list(zip(keys, values))
    expected = one_by_one(pairs, block_size)
    assert in_one_pass(pairs, block_size) == expected
    assert scanned(expected) == _read_entries(expected, "t.index") == pairs


def test_many_blocks_big_entries_and_empty_table():
    pairs = [(f"layer_{i:05d}/kernel".encode(), bytes([i % 251]) * (i % 40)) for i in range(5000)]
    pairs.insert(2500, (b"layer_02499/kernelz", bytes(600_000)))  # two blocks' worth alone
    data = one_by_one(pairs)
    assert in_one_pass(pairs) == data
    assert _read_entries(data, "x") == pairs and scanned(data) == pairs
    assert in_one_pass([]) == one_by_one([])
    assert scanned(one_by_one([])) == []


@pytest.mark.parametrize("keys", [[b"b", b"a"], [b"a", b"a"], [b"ab", b"a"]])
def test_build_rejects_keys_out_of_order(keys):
    with pytest.raises(InvalidArgumentError, match="strictly increasing"):
        build_table(keys, [Column.of_bytes([b""] * len(keys))])


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.integers(0, 30),
            st.lists(st.integers(0, 2**40), max_size=4).map(tuple),
            st.integers(0, 2**62),
            st.integers(0, 2**45),
            st.integers(0, 2**32 - 1),
        ),
        min_size=1,
        max_size=30,
    ),
    long_head=st.booleans(),
)
def test_entry_columns_are_head_plus_tail(entries, long_head):
    heads = sorted({entry_head(d, s) for d, s, *_ in entries})
    if long_head:  # a head past the window (as a partitioned tensor's slice list makes)
        heads.append(b"\x08\x01\x12\x00" + b"\x3a\x02\x0a\x00" * 80)
    ids = [heads.index(entry_head(d, s)) for d, s, *_ in entries]
    if long_head:
        ids[0] = len(heads) - 1
    offsets, sizes, crcs = (np.array([e[k] for e in entries], np.int64) for k in (2, 3, 4))
    columns = entry_columns(heads, np.array(ids, np.int64), offsets, sizes, crcs)
    keys = [b"%05d" % i for i in range(len(entries))]
    got = [v for _, v in read_table(build_table(keys, columns), "t").pairs()]
    assert got == [
        heads[h] + entry_tail(int(o), int(s), int(c))
        for h, o, s, c in zip(ids, offsets, sizes, crcs)
    ]


def test_reader_decodes_unusual_tables_entry_by_entry(monkeypatch):
    # A valid table with 200 entries between restart points (not TensorFlow's 16) and
    # varints of several bytes: the same pairs, through the entry-by-entry reader.
    monkeypatch.setattr(table_reference, "RESTART_INTERVAL", 200)
    pairs = [(b"k%04d" % i + b"x" * 200, bytes(300)) for i in range(500)]
    data = one_by_one(pairs)
    assert _scan(data, "t") is None
    assert scanned(data) == pairs


def _outcome(function, data):  # noqa: ANN001, ANN202
    try:
        return "ok", function(data)
    except (DataLossError, InvalidArgumentError) as exc:
        return type(exc).__name__, str(exc)


def test_reader_reports_damage_exactly_as_the_entry_by_entry_decode():
    pairs = [(f"w/{i:03d}".encode(), bytes([i]) * (i % 5)) for i in range(60)]
    data = one_by_one(pairs, block_size=128)
    damaged = 0
    for position in range(len(data)):
        for bit in (0, 7):
            broken = bytearray(data)
            broken[position] ^= 1 << bit
            expected = _outcome(lambda d: _read_entries(bytes(d), "t.index"), broken)
            assert _outcome(lambda d: scanned(bytes(d)), broken) == expected, position
            damaged += expected[0] != "ok"
    assert damaged > len(data)  # the checksums catch nearly every flip
