"""Flip one byte of a checkpoint value (its crc32c then fails), for the damage tests."""

from __future__ import annotations

from pathlib import Path

from trackpoint.bundle.entries import parse_entry
from trackpoint.bundle.slice_spec import decode_slice_key
from trackpoint.bundle.table import read_table


def corrupt(prefix: str, key: str) -> None:
    """Damage ``key``'s bytes: the value itself, or its first stored slice if it is sliced."""
    index = f"{prefix}.index"
    for raw_key, value in read_table(Path(index).read_bytes(), index).pairs():
        if raw_key.startswith(b"\x00"):
            name, _ = decode_slice_key(raw_key)
        else:
            name = raw_key.decode("utf-8")
        if name != key:
            continue
        entry = parse_entry(value, key=key, path=index)
        if entry.size:
            break
    else:
        raise AssertionError(f"no stored bytes for {key} in {prefix}")
    base = Path(prefix)
    (data,) = base.parent.glob(f"{base.name}.data-{entry.shard_id:05d}-of-*")
    raw = bytearray(data.read_bytes())
    raw[entry.offset + entry.size // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
