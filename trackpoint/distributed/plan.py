"""The save plan: which rank writes which value, checked before anything is written.

Every rank describes the values it holds (:class:`TensorInfo`: checkpoint key, slice spec, dtype,
shape, bytes); the coordinator checks the descriptions against each other and decides who writes
what (:func:`assign_writers`):

* a value held by one rank is written by it (its own slices of a sharded tensor);
* a value held by several ranks (the same key and slice spec: a replicated parameter, a DTensor
  replicated over a mesh dimension) is written once: by the holder that claims it (an
  incremental save: the rank that wrote it last time, so that it can reuse its own data file),
  else by the holder with the fewest bytes to write so far, largest values first (greedy
  balancing);
* the object graph is written by the coordinator, whose graph the checkpoint records.

A value written once for several ranks must be the same on all of them, or the checkpoint would
keep one rank's silently: :func:`replicas` names, for each rank, the values it shares with
others; each rank sends their content digests with its write status, and :func:`check_replicas`
refuses to commit if they differ (naming the key, the ranks and, for small values, the values).

Errors found here stop the save on every rank before any file is written: ranks disagreeing on
a value's dtype or shape, a key that is sliced on one rank and whole on another, slices that
overlap or leave part of the full tensor uncovered, keys missing from the coordinator's graph.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trackpoint.bundle.slice_spec import parse_slice_spec
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.saving.change_tracking import Token, ValueKey, value_tokens
from trackpoint.saving.sharding import ShardableTensor

__all__ = [
    "TensorInfo",
    "assign_writers",
    "check_replicas",
    "describe",
    "preview",
    "replica_digests",
    "replicas",
]

_MAX_LISTED = 5
_PREVIEW_BYTES = 64
"""Replicated values this small are shown in the error when ranks disagree on them."""
_PREVIEW_CHARS = 80


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What a rank holds of one value (no bytes): the unit of the save plan."""

    key: str
    """Checkpoint key."""
    spec: str
    """Slice spec (``""``: the whole value)."""
    dtype: str
    """``numpy.dtype.str`` (``"<f4"``; ``"|O"`` for strings)."""
    shape: tuple[int, ...]
    """Shape of the held part."""
    nbytes: int
    """Payload bytes (strings: their lengths), for balancing."""

    def to_json(self) -> list[Any]:
        return [self.key, self.spec, self.dtype, list(self.shape), self.nbytes]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> TensorInfo:
        key, spec, dtype, shape, nbytes = value
        return cls(str(key), str(spec), str(dtype), tuple(int(d) for d in shape), int(nbytes))


def _payload(array: np.ndarray) -> int:
    if array.dtype.kind in "OSU":
        return sum(len(x) if isinstance(x, (bytes, str)) else 0 for x in array.reshape(-1).tolist())
    return int(array.nbytes)


def describe(tensors: Sequence[ShardableTensor]) -> list[TensorInfo]:
    """The plan entries of this rank's evaluated values."""
    return [
        TensorInfo(st.checkpoint_key, st.slice_spec, st.dtype.str, tuple(st.shape),
                   _payload(st.tensor))
        for st in tensors
    ]


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _box(spec: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    parsed = parse_slice_spec(spec)
    assert parsed is not None
    full_shape, tensor_slice = parsed
    return full_shape, tensor_slice.bounds(full_shape)


def _check_tiling(key: str, specs: Sequence[str]) -> None:
    """The distinct slices of ``key`` must tile its full shape: no overlap, no hole."""
    full_shapes = {_box(spec)[0] for spec in specs}
    if len(full_shapes) > 1:
        shapes = sorted(list(s) for s in full_shapes)
        raise InvalidArgumentError(
            f"ranks disagree on the full shape of sharded checkpoint key {key!r}: {shapes}",
            key=key,
        )
    (full_shape,) = full_shapes
    boxes = [(_box(spec)[1], spec) for spec in specs]
    # Sweep along the dimension the slices cut most: only boxes whose ranges on it meet can
    # overlap, so row- or column-sharded tensors take linear time.
    axis = max(range(len(full_shape)), key=lambda d: len({b[d][0] for b, _ in boxes}))
    boxes.sort(key=lambda item: (item[0][axis], item[1]))
    for i, (bounds, spec) in enumerate(boxes):
        for other, other_spec in boxes[i + 1 :]:
            if other[axis][0] >= bounds[axis][1]:
                break
            if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(bounds, other)):
                raise InvalidArgumentError(
                    f"the slices {spec!r} and {other_spec!r} of checkpoint key {key!r} overlap; "
                    "each element of a sharded tensor must be held by exactly one slice (or by "
                    "identical slices on several ranks)",
                    key=key,
                )
    covered = sum(math.prod(hi - lo for lo, hi in bounds) for bounds, _ in boxes)
    total = math.prod(full_shape)
    if covered != total:
        raise InvalidArgumentError(
            f"the slices of checkpoint key {key!r} cover {covered} of the {total} elements of its "
            f"full shape {list(full_shape)}; the ranks' shards must cover the whole tensor "
            f"(slices: {_listing([s for _, s in boxes])})",
            key=key,
        )


def _check_consistent(
    holders: dict[tuple[str, str], list[int]], infos: dict[tuple[str, str], dict[int, TensorInfo]]
) -> None:
    for (key, spec), ranks in holders.items():
        seen = {(infos[(key, spec)][r].dtype, infos[(key, spec)][r].shape): r for r in ranks}
        if len(seen) > 1:
            found = "; ".join(f"rank {r}: {d} {list(s)}" for (d, s), r in sorted(
                seen.items(), key=lambda item: item[1]))
            what = f"slice {spec!r} of " if spec else ""
            raise InvalidArgumentError(
                f"ranks disagree on {what}checkpoint key {key!r}: {found}. A value saved by "
                "several ranks must be the same replica everywhere; describe shards with "
                "trackpoint.distributed.Slice / mark_sharded or DTensors",
                key=key,
            )


def assign_writers(
    infos_by_rank: Sequence[Sequence[TensorInfo]],
    *,
    coordinator: int = 0,
    graph_keys: Collection[str] | None = None,
    preferred: Sequence[Collection[int]] | None = None,
) -> list[list[int]]:
    """Decide which rank writes each value; validate the ranks' descriptions first.

    Args:
        infos_by_rank: each rank's values, in that rank's order.
        coordinator: the rank whose object graph is saved; it writes the graph.
        graph_keys: the checkpoint keys of the coordinator's object graph; every rank's keys
            must be among them (None: not checked).
        preferred: for each rank, indices (into its own list) of the values it claims; a
            value several ranks hold goes to the lowest claiming rank.

    Returns:
        For each rank, the indices (into its own list) of the values it writes.

    Raises:
        InvalidArgumentError: the descriptions disagree (see the module docstring).
    """
    holders: dict[tuple[str, str], list[int]] = {}
    infos: dict[tuple[str, str], dict[int, TensorInfo]] = {}
    sliced: dict[str, set[str]] = {}
    dtypes: dict[str, dict[str, int]] = {}
    for rank, rank_infos in enumerate(infos_by_rank):
        for info in rank_infos:
            ident = (info.key, info.spec)
            holders.setdefault(ident, []).append(rank)
            infos.setdefault(ident, {})[rank] = info
            sliced.setdefault(info.key, set()).add(info.spec)
            dtypes.setdefault(info.key, {}).setdefault(info.dtype, rank)

    if graph_keys is not None:
        known = set(graph_keys) | {OBJECT_GRAPH_KEY}
        strays = sorted(
            f"{key!r} (rank {ranks[0]})" for (key, _), ranks in holders.items()
            if key not in known
        )
        if strays:
            raise InvalidArgumentError(
                f"checkpoint keys {_listing(strays)} are not in the object graph of rank "
                f"{coordinator}, which the checkpoint records; every rank must build the same "
                "objects (keep per-rank values in a tensor sharded by rank)",
            )
    _check_consistent(holders, infos)
    for key, kinds in dtypes.items():
        if len(kinds) > 1:
            ordered = sorted(kinds.items(), key=lambda item: item[1])
            found = "; ".join(f"rank {r}: {d}" for d, r in ordered)
            raise InvalidArgumentError(
                f"ranks disagree on the dtype of checkpoint key {key!r}: {found}", key=key
            )
    for key, specs in sliced.items():
        if "" in specs and len(specs) > 1:
            raise InvalidArgumentError(
                f"checkpoint key {key!r} is a whole tensor on some ranks and sliced on others "
                f"({_listing(sorted(s for s in specs if s))}); give every rank's part a layout",
                key=key,
            )
        if "" not in specs:
            _check_tiling(key, sorted(specs))

    claimed: dict[tuple[str, str], int] = {}
    for rank, indices in reversed(list(enumerate(preferred or ()))):
        for i in indices:
            if 0 <= i < len(infos_by_rank[rank]):
                info = infos_by_rank[rank][i]
                claimed[(info.key, info.spec)] = rank
    loads = [0] * len(infos_by_rank)
    writer: dict[tuple[str, str], int] = {}
    shared: list[tuple[int, str, str]] = []
    for ident, ranks in holders.items():
        if ident[0] == OBJECT_GRAPH_KEY and coordinator in ranks:
            writer[ident] = coordinator
        elif len(ranks) == 1:
            writer[ident] = ranks[0]
        elif ident in claimed:
            writer[ident] = claimed[ident]
        else:
            shared.append((-infos[ident][ranks[0]].nbytes, *ident))
            continue
        loads[writer[ident]] += infos[ident][writer[ident]].nbytes
    for negative_bytes, key, spec in sorted(shared):
        rank = min(holders[(key, spec)], key=lambda r: (loads[r], r))
        writer[(key, spec)] = rank
        loads[rank] -= negative_bytes
    return [
        [i for i, info in enumerate(rank_infos) if writer[(info.key, info.spec)] == rank]
        for rank, rank_infos in enumerate(infos_by_rank)
    ]


def replicas(infos_by_rank: Sequence[Sequence[TensorInfo]]) -> list[list[int]]:
    """For each rank, the indices of its values that other ranks hold too (same key and slice).

    These are written once, so they must be equal everywhere (:func:`check_replicas`). The
    object graph is left out: each rank describes its own, and the coordinator's is recorded.
    """
    count: dict[tuple[str, str], int] = {}
    for rank_infos in infos_by_rank:
        for info in rank_infos:
            ident = (info.key, info.spec)
            count[ident] = count.get(ident, 0) + 1
    return [
        [
            i for i, info in enumerate(rank_infos)
            if count[(info.key, info.spec)] > 1 and info.key != OBJECT_GRAPH_KEY
        ]
        for rank_infos in infos_by_rank
    ]


def preview(array: np.ndarray) -> str | None:
    """A short text of a small value, for the error naming replicas that differ; else None."""
    if array.size > 16 or _payload(array) > _PREVIEW_BYTES:
        return None
    items = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x
             for x in array.reshape(-1).tolist()]
    text = repr(items[0]) if array.ndim == 0 else repr(items)
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 3] + "..."


def replica_digests(
    tensors: Sequence[ShardableTensor],
    indices: Sequence[int],
    call_tokens: Mapping[ValueKey, Token] | None = None,
) -> list[list[Any]]:
    """``[digest (hex), preview]`` of each of ``tensors[indices]`` (this rank's replicas).

    ``call_tokens``: digests an async save took at the call, reused (the values it did not copy
    may have changed since); the others are hashed now, from the save's snapshot.
    """
    chosen = [tensors[i] for i in indices]
    known = call_tokens or {}
    digests: dict[ValueKey, bytes] = {}
    todo = []
    for st in chosen:
        token = known.get((st.checkpoint_key, st.slice_spec))
        if isinstance(token, bytes):
            digests[(st.checkpoint_key, st.slice_spec)] = token
        else:
            todo.append(st)
    for ident, token in value_tokens(todo, {}).items():
        assert isinstance(token, bytes)  # no versions given: every token is a digest
        digests[ident] = token
    return [
        [digests[(st.checkpoint_key, st.slice_spec)].hex(), preview(st.tensor)] for st in chosen
    ]


def check_replicas(
    infos_by_rank: Sequence[Sequence[TensorInfo]],
    replicas_by_rank: Sequence[Sequence[int]],
    digests_by_rank: Sequence[Sequence[Sequence[Any]]],
) -> None:
    """Refuse replicated values that differ between ranks.

    Args:
        infos_by_rank: each rank's values, as given to :func:`assign_writers`.
        replicas_by_rank: :func:`replicas` of them.
        digests_by_rank: for each rank, one ``[digest, preview or None]`` per index of its
            ``replicas_by_rank`` entry (``digest``: hex of the value's content digest).

    Raises:
        InvalidArgumentError: a value held by several ranks differs; names every such key (up
            to a few), which ranks hold which version, and small values themselves.
    """
    seen: dict[tuple[str, str], dict[str, tuple[list[int], str | None]]] = {}
    for rank, (indices, digests) in enumerate(zip(replicas_by_rank, digests_by_rank)):
        for i, (digest, shown) in zip(indices, digests):
            info = infos_by_rank[rank][i]
            versions = seen.setdefault((info.key, info.spec), {})
            versions.setdefault(str(digest), ([], shown))[0].append(rank)
    differing: list[tuple[str, str]] = []
    for (key, spec), versions in seen.items():
        if len(versions) < 2:
            continue
        parts = []
        for ranks, shown in sorted(versions.values(), key=lambda item: item[0]):
            who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
            parts.append(f"{who}: {shown}" if shown is not None else who)
        what = f"slice {spec!r} of " if spec else ""
        differing.append((key, f"{what}{key!r} ({'; '.join(parts)})"))
    if differing:
        raise InvalidArgumentError(
            f"values held by several ranks differ between them: "
            f"{_listing([text for _, text in differing])}. A value "
            "every rank holds whole is written once, so its ranks must hold the same value; "
            "nothing was committed. Make them equal before saving (replicated parameters, the "
            "same step), or keep per-process state (a data loader's position, an RNG state) "
            "per process: give each rank its own part of a tensor sharded by rank, "
            "tpd.Slice(np.array([value]), (world_size,), (rank,))",
            key=differing[0][0],
        )
