"""``DT_STRING`` tensors in data files (tf-checkpoint-format.md §6.2).

Layout: one varint length per element, a 4-byte masked CRC of the lengths, then the element
bytes back to back. The lengths checksum hashes each length as a little-endian uint32 (uint64
when it does not fit); the entry checksum continues that same running CRC over the 4 stored
checksum bytes and then the element bytes. Varints are encoded and decoded with numpy and the
element bytes hashed as one buffer, so only splitting into Python ``bytes`` objects loops.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from trackpoint.bundle.crc import crc32c, extend, mask, unmask
from trackpoint.errors import DataLossError, InvalidArgumentError

__all__ = ["EncodedStrings", "decode_strings", "encode_strings", "string_elements"]

_U32_MAX = 0xFFFFFFFF
_MAX_VARINT = 10


@dataclass(frozen=True, slots=True)
class EncodedStrings:
    """A string tensor ready to append to a data file."""

    header: bytes  # varint lengths + masked lengths checksum (4 bytes LE)
    payload: bytes  # element bytes, concatenated
    masked_crc: int  # BundleEntryProto.crc32c

    @property
    def size(self) -> int:
        return len(self.header) + len(self.payload)


def string_elements(array: np.ndarray, key: str) -> list[bytes]:
    """The elements of a string-like array, row-major, as ``bytes`` (``str`` encoded UTF-8).

    Object arrays and ``StringDType`` keep every byte. A fixed-width ``S`` element is numpy's
    value of it, without the NUL padding (numpy cannot tell trailing NUL bytes from padding;
    TensorFlow converts ``S`` arrays the same way).

    Raises:
        InvalidArgumentError: an object array holds something other than ``bytes``/``str``.
    """
    flat = array.reshape(-1, order="C") if array.flags.c_contiguous else array.ravel(order="C")
    kind = array.dtype.kind
    if kind == "S":
        return list(flat.tolist())
    if kind in "UT":  # fixed-width unicode, numpy 2's StringDType: str elements
        return [s.encode("utf-8", "surrogatepass") for s in flat.tolist()]
    out: list[bytes] = []
    for i, item in enumerate(flat.tolist()):
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, str):
            out.append(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, (bytearray, memoryview)):
            out.append(bytes(item))
        else:
            raise InvalidArgumentError(
                f"Unsupported element in object array for key '{key}': element {i} is "
                f"{type(item).__name__}; string tensors hold bytes or str only",
                key=key,
            )
    return out


def _encode_varints(lengths: np.ndarray) -> bytes:
    """LEB128 of every value in ``lengths`` (uint64), concatenated; vectorised."""
    n = lengths.size
    if n == 0:
        return b""
    nbytes = np.ones(n, dtype=np.int64)
    for j in range(1, _MAX_VARINT):
        nbytes += lengths >= (np.uint64(1) << np.uint64(7 * j))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.zeros(int(ends[-1]), dtype=np.uint8)
    for j in range(int(nbytes.max())):
        sel = nbytes > j
        group = (lengths[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (nbytes[sel] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + j] = (group | more).astype(np.uint8)
    return out.tobytes()


def _lengths_crc(lengths: np.ndarray, order: str = "<") -> int:
    """Running CRC over each length as a uint32 (uint64 above 2**32-1) in file byte order."""
    if lengths.size == 0 or int(lengths.max()) <= _U32_MAX:
        return crc32c(lengths.astype(f"{order}u4").tobytes())
    crc = 0
    for length in lengths.tolist():
        crc = extend(crc, struct.pack(f"{order}I" if length <= _U32_MAX else f"{order}Q", length))
    return crc


def encode_strings(elements: list[bytes]) -> EncodedStrings:
    """Encode string elements (row-major) as TensorFlow lays them out."""
    lengths = np.fromiter(map(len, elements), dtype=np.uint64, count=len(elements))
    crc = _lengths_crc(lengths)
    checksum = struct.pack("<I", mask(crc))
    payload = b"".join(elements)
    crc = extend(extend(crc, checksum), payload)
    return EncodedStrings(_encode_varints(lengths) + checksum, payload, mask(crc))


def _decode_varints(buf: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """The first ``count`` varints of ``buf`` and the byte length they occupy."""
    if count == 0:
        return np.zeros(0, dtype=np.uint64), 0
    window = buf[: count * _MAX_VARINT]
    ends = np.flatnonzero(window < 0x80)[:count]
    if ends.size < count:
        raise ValueError("string lengths are truncated")
    starts = np.empty(count, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    widths = ends - starts + 1
    if int(widths.max()) > _MAX_VARINT:
        raise ValueError("a string length varint is longer than 10 bytes")
    used = int(ends[-1]) + 1
    region = window[:used].astype(np.uint64) & np.uint64(0x7F)
    position = np.arange(used, dtype=np.int64) - np.repeat(starts, widths)
    shifted = region << (np.uint64(7) * position.astype(np.uint64))
    return np.add.reduceat(shifted, starts), used


def decode_strings(
    data: memoryview,
    count: int,
    stored_crc: int,
    *,
    key: str,
    path: str,
    big_endian: bool = False,
) -> list[bytes]:
    """Decode ``count`` string elements from ``data`` (exactly the entry's ``size`` bytes).

    ``big_endian``: the file's byte order, which the lengths checksum follows (§4).

    Raises:
        DataLossError: malformed lengths, "length checksum does not match", "Checksum does
            not match", or a size that disagrees with the lengths.
    """
    where = f"for key '{key}' in {path}"
    if len(data) == 0 and count == 0:
        return []
    raw = np.frombuffer(data, dtype=np.uint8)
    try:
        lengths, used = _decode_varints(raw, count)
    except ValueError as exc:
        raise DataLossError(f"Corrupt string tensor {where}: {exc}", key=key, path=path) from None
    if used + 4 > len(data):
        raise DataLossError(
            f"Corrupt string tensor {where}: {len(data)} bytes cannot hold {count} lengths and "
            "their checksum",
            key=key,
            path=path,
        )
    order = ">" if big_endian else "<"
    crc = _lengths_crc(lengths, order)
    checksum = data[used : used + 4]
    (stored_length_crc,) = struct.unpack(f"{order}I", checksum)
    if unmask(stored_length_crc) != crc:
        raise DataLossError(
            f"The length checksum does not match {where}: stored {unmask(stored_length_crc)} "
            f"vs. calculated {crc}. The data file is corrupt",
            key=key,
            path=path,
        )
    # Each length within the entry first: a sum of hostile uint64 lengths can wrap around to
    # the entry's size, and int64 offsets of such lengths would slice the wrong bytes.
    if count and int(lengths.max()) > len(data):
        raise DataLossError(
            f"Corrupt string tensor {where}: a string length of {int(lengths.max())} bytes "
            f"exceeds the entry's {len(data)} bytes",
            key=key,
            path=path,
        )
    total = int(lengths.sum(dtype=np.uint64)) if count else 0
    if used + 4 + total != len(data):
        raise DataLossError(
            f"Corrupt string tensor {where}: entry size {len(data)} does not match "
            f"{used} length bytes + 4 + {total} element bytes",
            key=key,
            path=path,
        )
    payload = data[used + 4 :]
    crc = extend(extend(crc, checksum), payload)
    if crc != unmask(stored_crc):
        raise DataLossError(
            f"Checksum does not match: stored {unmask(stored_crc)} vs. calculated {crc} {where}",
            key=key,
            path=path,
        )
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bounds = offsets.tolist()
    blob = bytes(payload) if total < (1 << 26) else payload
    return [bytes(blob[bounds[i] : bounds[i + 1]]) for i in range(count)]
