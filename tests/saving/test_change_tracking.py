"""Change signals of incremental saves (trackpoint/saving/change_tracking.py): content digests
hashed on several threads equal the one-thread digests, large arrays hashed in runs of rows
still change with any byte, and exact versions taken at the call are the ones used."""

from __future__ import annotations

import weakref

import numpy as np

from trackpoint.saving import change_tracking
from trackpoint.saving.change_tracking import (
    ValueVersion,
    content_digest,
    value_tokens,
    value_versions,
)
from trackpoint.saving.sharding import ShardableTensor

MIB = 1 << 20


def _value(array: np.ndarray, key: str, trackable: object = None) -> ShardableTensor:
    return ShardableTensor(
        array, array.dtype, None, key, array.shape, "", key, trackable
    )  # fmt: skip


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    large = rng.random((80 * MIB // 4 // 256, 256), dtype=np.float32)  # 80 MiB: 3 runs
    return [
        large,
        np.asfortranarray(large[:, :128]),  # not contiguous, 40 MiB
        large[:4096].astype(">f4"),  # big-endian
        np.array(3.5),  # 0-d
        np.zeros((0, 4), np.int64),  # empty
        np.array([b"a", b"bc", b""], object),  # strings
        rng.random(1000),
    ]


def test_parallel_digests_equal_one_thread_digests() -> None:
    arrays = _arrays()
    assert sum(a.nbytes for a in arrays) > change_tracking._PARALLEL_BYTES
    serial = [content_digest(a) for a in arrays]
    assert change_tracking._digests(arrays) == serial
    assert len(set(serial)) == len(serial)


def test_large_arrays_change_with_any_byte_and_not_with_the_layout() -> None:
    large = _arrays()[0]
    assert len(change_tracking._segments(large)) == 3
    before = content_digest(large)
    assert content_digest(np.asfortranarray(large)) == before
    assert content_digest(large.astype(">f4")) == before
    changed = large.copy()
    changed[-1, -1] += 1.0  # the last byte of the last run
    assert content_digest(changed) != before
    changed = large.copy()
    changed.view(np.uint32)[len(large) // 2, 7] ^= 1  # one bit in the middle
    assert content_digest(changed) != before
    assert content_digest(large.reshape(-1, 512)) != before  # same bytes, other shape


class _Holder:
    """A trackable with an exact signal for one of its two values."""

    def __init__(self, version: ValueVersion) -> None:
        self.version = version

    def _value_versions(self) -> dict[str, ValueVersion | None]:
        return {"a": self.version, "b": None}


def test_versions_taken_at_the_call_are_the_tokens() -> None:
    anchor = np.zeros(1)
    holder = _Holder(ValueVersion(weakref.ref(anchor)))
    a = _value(np.ones(3), "x/.ATTRIBUTES/a", holder)
    b = _value(np.ones(3), "x/.ATTRIBUTES/b", holder)
    versions = value_versions([a, b], trust=True)
    assert list(versions) == [("x/.ATTRIBUTES/a", "")]
    later = ValueVersion(weakref.ref(np.zeros(1)))
    holder.version = later  # the holder moved on after the call
    tokens = value_tokens([a, b], versions)
    assert tokens[("x/.ATTRIBUTES/a", "")] is versions[("x/.ATTRIBUTES/a", "")]
    assert tokens[("x/.ATTRIBUTES/b", "")] == content_digest(np.ones(3))
    assert value_tokens([a, b], trust=True)[("x/.ATTRIBUTES/a", "")] is later
    # No versions at all (an async distributed save's copies): every value is hashed.
    assert value_tokens([a], {})[("x/.ATTRIBUTES/a", "")] == content_digest(np.ones(3))


def test_exact_versions_are_not_trusted_by_default() -> None:
    """Issue 27 finding 14: without ``trust_immutable_arrays`` a value offering a version is
    hashed like any other (a CPU jax.Array can be written in place through DLPack)."""
    holder = _Holder(ValueVersion(weakref.ref(np.zeros(1))))
    a = _value(np.ones(3), "x/.ATTRIBUTES/a", holder)
    assert value_versions([a]) == {}
    assert value_tokens([a])[("x/.ATTRIBUTES/a", "")] == content_digest(np.ones(3))
