"""Slices of partitioned tensors: ``TensorSlice``, its text forms, protos and keys (§7, §8).

A slice is a box: per dimension a ``start`` and a ``length``, where length -1 means "the whole
dimension" (start is then 0). Three encodings exist and all are handled here:

* the C++ string ``-:0,2`` (``start,length`` or ``-`` per dimension, joined by ``:``);
* the Python ``SaveSliceInfo.spec`` ``"4 6 0,4:0,2"`` (full shape, a space, then the slice;
  ``""`` is the whole tensor);
* ``TensorSliceProto`` and the OrderedCode-encoded index key of a slice entry (§8.3).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trackpoint.bundle.protos.tensor_slice_pb2 import TensorSliceProto
from trackpoint.errors import InvalidArgumentError

__all__ = [
    "TensorSlice",
    "decode_slice_key",
    "encode_slice_key",
    "format_slice_spec",
    "parse_slice_spec",
]


@dataclass(frozen=True, slots=True)
class TensorSlice:
    """A box in a tensor: per dimension ``starts[i]`` and ``lengths[i]`` (-1: whole dimension)."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.lengths):
            raise InvalidArgumentError(
                f"TensorSlice has {len(self.starts)} starts but {len(self.lengths)} lengths"
            )
        for start, length in zip(self.starts, self.lengths):
            if length == -1 and start != 0:
                raise InvalidArgumentError(f"whole-dimension extent must start at 0, not {start}")
            if start < 0 or length < -1:
                raise InvalidArgumentError(
                    f"invalid slice extent {start},{length}: start must be >= 0 and length >= 0"
                )

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def full(cls, rank: int) -> TensorSlice:
        """The slice covering every dimension of a rank-``rank`` tensor."""
        return cls((0,) * rank, (-1,) * rank)

    @classmethod
    def from_bounds(cls, starts: Sequence[int], lengths: Sequence[int]) -> TensorSlice:
        """A slice from any integer sequences (numpy ints included)."""
        return cls(tuple(int(s) for s in starts), tuple(int(n) for n in lengths))

    @classmethod
    def parse(cls, text: str) -> TensorSlice:
        """Parse the C++ form, e.g. ``"-:0,2"``; ``""`` is the rank-0 slice.

        Raises:
            InvalidArgumentError: malformed text.
        """
        if text == "":
            return cls((), ())
        starts: list[int] = []
        lengths: list[int] = []
        for item in text.split(":"):
            if item == "-":
                starts.append(0)
                lengths.append(-1)
                continue
            parts = item.split(",")
            try:
                if len(parts) != 2:
                    raise ValueError(item)
                start, length = int(parts[0]), int(parts[1])
            except ValueError:
                raise InvalidArgumentError(
                    f"Invalid tensor slice '{text}': expected '-' or 'start,length' per "
                    f"dimension joined by ':', got '{item}'"
                ) from None
            if start < 0 or length <= 0:
                raise InvalidArgumentError(
                    f"Invalid tensor slice '{text}': start must be >= 0 and length > 0 in '{item}'"
                )
            starts.append(start)
            lengths.append(length)
        return cls(tuple(starts), tuple(lengths))

    def __str__(self) -> str:
        """The C++ form, e.g. ``-:0,2``."""
        return ":".join("-" if n == -1 else f"{s},{n}" for s, n in zip(self.starts, self.lengths))

    # -- protos ----------------------------------------------------------------------------
    def to_proto(self) -> TensorSliceProto:
        """As TF writes it: whole dim = empty Extent; partial = start (omitted if 0) + length."""
        proto = TensorSliceProto()
        for start, length in zip(self.starts, self.lengths):
            extent = proto.extent.add()
            if length != -1:
                extent.start = start
                extent.length = length
        return proto

    @classmethod
    def from_proto(cls, proto: TensorSliceProto) -> TensorSlice:
        """Inverse of :meth:`to_proto`; an extent without ``length`` is a whole dimension."""
        starts = []
        lengths = []
        for extent in proto.extent:
            if extent.HasField("length"):
                starts.append(extent.start)
                lengths.append(extent.length)
            else:
                starts.append(0)
                lengths.append(-1)
        return cls(tuple(starts), tuple(lengths))

    # -- geometry --------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.starts)

    def _check_rank(self, full_shape: Sequence[int]) -> None:
        if len(full_shape) != self.rank:
            raise InvalidArgumentError(
                f"slice '{self}' has rank {self.rank} but the tensor shape "
                f"{list(full_shape)} has rank {len(full_shape)}"
            )

    def bounds(self, full_shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Per dimension ``(start, stop)`` in ``full_shape``, whole dimensions resolved.

        Raises:
            InvalidArgumentError: wrong rank, or the slice extends past ``full_shape``.
        """
        self._check_rank(full_shape)
        out = []
        for start, length, dim in zip(self.starts, self.lengths, full_shape):
            stop = dim if length == -1 else start + length
            if stop > dim:
                raise InvalidArgumentError(
                    f"slice '{self}' does not fit in tensor shape {list(full_shape)}"
                )
            out.append((start, stop))
        return tuple(out)

    def shape_in(self, full_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of this slice of a tensor of ``full_shape``."""
        return tuple(stop - start for start, stop in self.bounds(full_shape))

    def is_full(self, full_shape: Sequence[int]) -> bool:
        """True if the slice covers all of ``full_shape`` (all ``-`` or explicit full extents)."""
        return all(
            start == 0 and stop == dim
            for (start, stop), dim in zip(self.bounds(full_shape), full_shape)
        )

    def num_elements(self, full_shape: Sequence[int]) -> int:
        count = 1
        for dim in self.shape_in(full_shape):
            count *= dim
        return count

    def intersect(self, other: TensorSlice) -> TensorSlice | None:
        """The common box of two slices, or ``None`` if they do not overlap."""
        if other.rank != self.rank:
            raise InvalidArgumentError(f"cannot intersect slices '{self}' and '{other}'")
        starts = []
        lengths = []
        for s1, n1, s2, n2 in zip(self.starts, self.lengths, other.starts, other.lengths):
            if n1 == -1 and n2 == -1:
                starts.append(0)
                lengths.append(-1)
                continue
            if n1 == -1:
                s, n = s2, n2
            elif n2 == -1:
                s, n = s1, n1
            else:
                s = max(s1, s2)
                n = min(s1 + n1, s2 + n2) - s
            if n <= 0:
                return None
            starts.append(s)
            lengths.append(n)
        return TensorSlice(tuple(starts), tuple(lengths))

    def numpy_index(self, full_shape: Sequence[int]) -> tuple[slice, ...]:
        """Index selecting this slice from an array of ``full_shape``."""
        return tuple(slice(start, stop) for start, stop in self.bounds(full_shape))

    def relative_to(self, outer: TensorSlice, full_shape: Sequence[int]) -> tuple[slice, ...]:
        """Index selecting this slice inside an array holding just ``outer`` (which contains it)."""
        mine = self.bounds(full_shape)
        base = outer.bounds(full_shape)
        return tuple(slice(s - b, e - b) for (s, e), (b, _) in zip(mine, base))


# -- the Python SaveSliceInfo spec form (§7) ----------------------------------------------


def parse_slice_spec(spec: str) -> tuple[tuple[int, ...], TensorSlice] | None:
    """Parse ``"4 6 0,4:0,2"`` into ``((4, 6), TensorSlice)``; ``""`` (whole tensor) -> None.

    The slice part may also use ``-`` for a whole dimension, as SaveV2 accepts.

    Raises:
        InvalidArgumentError: malformed spec, or a slice that does not fit the shape.
    """
    spec = spec.strip()
    if not spec:
        return None
    parts = spec.split(" ")
    try:
        shape = tuple(int(p) for p in parts[:-1])
    except ValueError:
        raise InvalidArgumentError(
            f"Invalid slice spec '{spec}': expected the full shape as integers separated by "
            "spaces, a space, then the slice (e.g. '4 6 0,4:0,2')"
        ) from None
    if len(parts) < 2 or any(d < 0 for d in shape):
        raise InvalidArgumentError(
            f"Invalid slice spec '{spec}': expected '<full shape> <slice>' such as '4 6 0,4:0,2'"
        )
    tensor_slice = TensorSlice.parse(parts[-1])
    tensor_slice.bounds(shape)  # validates rank and fit
    return shape, tensor_slice


def format_slice_spec(full_shape: Sequence[int], tensor_slice: TensorSlice) -> str:
    """The Python spec form: full shape, a space, explicit ``start,length`` for every dimension."""
    dims = " ".join(str(int(d)) for d in full_shape)
    extents = ":".join(f"{start},{stop - start}" for start, stop in tensor_slice.bounds(full_shape))
    return f"{dims} {extents}"


# -- OrderedCode keys of slice entries (§8.3) ---------------------------------------------


def _num_increasing(value: int) -> bytes:
    body = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return bytes((len(body),)) + body


def _signed_num_increasing(value: int) -> bytes:
    x = value if value >= 0 else ~value
    length = x.bit_length() // 7 + 1
    if length > 10:
        raise InvalidArgumentError(f"slice bound {value} is too large to encode")
    raw = bytearray((value & ((1 << 80) - 1)).to_bytes(10, "big")[10 - length :])
    if length <= 8:
        raw[0] ^= (0xFF00 >> length) & 0xFF
    else:
        raw[0] ^= 0xFF
        raw[1] ^= 0x80 if length == 9 else 0xC0
    return bytes(raw)


_ESCAPE = re.compile(rb"[\x00\xff]")
_ESCAPES = {b"\x00": b"\x00\xff", b"\xff": b"\xff\x00"}


def encode_slice_key(key: str, tensor_slice: TensorSlice) -> bytes:
    """The index key of a slice entry: OrderedCode(0, key, rank, start/length per dim)."""
    # One pass: 00 -> 00 ff and ff -> ff 00 (sequential replaces would re-escape each other).
    name = _ESCAPE.sub(lambda m: _ESCAPES[m.group()], key.encode("utf-8", "surrogateescape"))
    out = bytearray(b"\x00")
    out += name + b"\x00\x01"
    out += _num_increasing(tensor_slice.rank)
    for start, length in zip(tensor_slice.starts, tensor_slice.lengths):
        out += _signed_num_increasing(start)
        out += _signed_num_increasing(length)
    return bytes(out)


def _decode_signed(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise ValueError("truncated signed number")
    first = buf[pos]
    negative = first < 0x80
    inv = 0xFF if negative else 0x00
    b0 = first ^ inv
    length = 0
    while length < 8 and b0 & (0x80 >> length):
        length += 1
    if length == 8 and pos + 1 < len(buf):
        b1 = buf[pos + 1] ^ inv
        if b1 & 0x80:
            length = 10 if b1 & 0x40 else 9
    if pos + length > len(buf):
        raise ValueError("truncated signed number")
    raw = bytearray(buf[pos : pos + length])
    if length <= 8:
        raw[0] ^= (0xFF00 >> length) & 0xFF
    else:
        raw[0] ^= 0xFF
        raw[1] ^= 0x80 if length == 9 else 0xC0
    value = int.from_bytes(raw, "big", signed=False)
    if negative:
        value -= 1 << (8 * length)
    return value, pos + length


def decode_slice_key(data: bytes) -> tuple[str, TensorSlice]:
    """Inverse of :func:`encode_slice_key`.

    Raises:
        ValueError: ``data`` is not a slice key (callers map this to their own error).
    """
    if not data or data[0] != 0:
        raise ValueError("slice keys start with byte 00")
    pos = 1
    name = bytearray()
    while True:
        if pos + 1 >= len(data):
            raise ValueError("unterminated key string")
        byte = data[pos]
        if byte == 0x00:
            nxt = data[pos + 1]
            if nxt == 0x01:
                pos += 2
                break
            if nxt != 0xFF:
                raise ValueError("bad escape in key string")
            name.append(0x00)
            pos += 2
        elif byte == 0xFF:
            if data[pos + 1] != 0x00:
                raise ValueError("bad escape in key string")
            name.append(0xFF)
            pos += 2
        else:
            name.append(byte)
            pos += 1
    width = data[pos]
    if width > 8 or pos + 1 + width > len(data):
        raise ValueError("bad rank")
    rank = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
    pos += 1 + width
    starts = []
    lengths = []
    for _ in range(rank):
        start, pos = _decode_signed(data, pos)
        length, pos = _decode_signed(data, pos)
        starts.append(start)
        lengths.append(length)
    if pos != len(data):
        raise ValueError("trailing bytes after slice key")
    return name.decode("utf-8", errors="surrogateescape"), TensorSlice(
        tuple(starts), tuple(lengths)
    )
