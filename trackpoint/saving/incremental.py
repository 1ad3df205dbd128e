"""Incremental saves: values unchanged since the previous checkpoint are not written again.

``CheckpointOptions(incremental=True)`` (docs/incremental.md). A :class:`SaveHistory`, kept by
the ``Checkpoint``, remembers the previous checkpoint it wrote (with every value's token,
:mod:`trackpoint.saving.change_tracking`) or restored (no tokens: values are compared with the
stored bytes). A save then runs, on the caller's thread (before an async save copies anything):

1. Every value gets its token; a value is *unchanged* when its token equals the recorded one
   (or, after a restore, its bytes equal the stored ones) and the previous checkpoint still
   stores it under the same key, dtype and full shape.
2. A data file of the previous checkpoint is *reused* when every tensor in it belongs to an
   unchanged value (no stale bytes, no bytes of a changed value) and its bytes are still
   good (read at each save and checked by the values' digests or the entries' crc32c: a file
   damaged in place, even with its size and mtime kept, is never linked; its values are
   written from memory and a warning names it); it becomes a linked bundle
   (:mod:`trackpoint.saving.linking`) with the same offsets and checksums.
3. What is left is written, grouped so that later saves can reuse whole files: each value of
   1 MiB or more in files of its own (up to 1,024 of them), the small ones in one group of
   values that were unchanged but had to be rewritten and one group of the others. The
   sharding policy cuts each group (``MaxShardSizePolicy`` limits still hold).

After the commit the history records the new checkpoint (its index digest and file sizes, so
a checkpoint replaced or damaged behind our back is never linked from) and every value's token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import xxhash

from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import index_filename
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import CheckpointError
from trackpoint.saving.change_tracking import (
    Token,
    ValueKey,
    ValueVersion,
    content_digest,
    same_token,
    value_tokens,
)
from trackpoint.saving.linking import (
    Expected,
    LinkedFile,
    Piece,
    PreviousCheckpoint,
    expected_digests,
    link_bundle,
    piece_tensor,
    value_box,
    verify_files,
)
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.shard_validation import policy_description, validate_shards
from trackpoint.saving.sharding import (
    MaxShardSizePolicy,
    Shard,
    ShardableTensor,
    ShardByTaskPolicy,
)
from trackpoint.saving.snapshot import SaveSnapshot
from trackpoint.storage import FsspecStorage, LocalStorage, Storage, locate
from trackpoint.storage.base import DelegatingStorage

__all__ = [
    "IncrementalPlan",
    "SaveHistory",
    "plan_of",
    "prepare_incremental",
    "record_incremental",
]

logger = logging.getLogger(__name__)

_OWN_FILE_BYTES = 1 << 20  # values this large get data files of their own
_MAX_OWN_FILES = 1024  # ... up to this many per save; the rest join their group's file
# Verify the bytes of every data file before it is linked (bench/incremental.py turns it off
# to measure what the verification costs; nothing else should).
_VERIFY_LINKED = True


def _digest(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


def _unwrap(storage: Storage) -> Storage:
    while isinstance(storage, DelegatingStorage):
        storage = storage.inner
    return storage


def _same_backend(a: Storage, b: Storage) -> bool:
    """True if a file of ``a`` can be linked into ``b`` (same filesystem namespace)."""
    a, b = _unwrap(a), _unwrap(b)
    if isinstance(a, LocalStorage) and isinstance(b, LocalStorage):
        return True
    if isinstance(a, FsspecStorage) and isinstance(b, FsspecStorage):
        return a.fs is b.fs
    return a is b


@dataclass(frozen=True, slots=True)
class _Baseline:
    """The checkpoint a next incremental save compares against."""

    prefix: str
    storage: Storage
    tokens: dict[ValueKey, Token] | None
    """Every value's token when written by this history; None after a restore."""
    index_digest: bytes | None = None
    file_sizes: tuple[int, ...] | None = None
    parsed: PreviousCheckpoint | None = None
    """Its index as read back after the commit (reused while the index bytes are the same)."""
    held: Mapping[ValueKey, Token] | None = None
    """Tokens of every value the saving process held (a rank of a distributed save also holds
    values another rank wrote), when known; else those of ``tokens``."""


class SaveHistory:
    """What a ``Checkpoint`` remembers of its previous checkpoint, for incremental saves.

    Set after each incremental save commits (on the writer thread for async saves) and after
    each restore. Thread-safe. Saves of one history never overlap: an async save waits for
    the previous one before it plans.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._baseline: _Baseline | None = None

    @property
    def prefix(self) -> str | None:
        """The checkpoint the next incremental save compares against, if any."""
        baseline = self._baseline
        return baseline.prefix if baseline is not None else None

    def recorded(self) -> frozenset[ValueKey]:
        """The values whose tokens were recorded: those this history's last save wrote.

        A distributed save asks the rank that wrote a value last time to write it again, so
        that it can reuse its own file (``trackpoint.distributed``).
        """
        baseline = self._baseline
        if baseline is None or baseline.tokens is None:
            return frozenset()
        return frozenset(baseline.tokens)

    def unchanged(self, tokens: Mapping[ValueKey, Token]) -> frozenset[ValueKey]:
        """The values of ``tokens`` certainly equal to the ones this history's last save wrote.

        An async distributed save asks at the call, so that it copies only the other values
        (``trackpoint.distributed``); after a restore (no recorded tokens) none are.
        """
        baseline = self._baseline
        if baseline is None or baseline.tokens is None:
            return frozenset()
        recorded = baseline.held if baseline.held is not None else baseline.tokens
        return frozenset(k for k, token in tokens.items() if same_token(recorded.get(k), token))

    def restored(self, prefix: str, storage: Storage | None) -> None:
        """``prefix`` was just restored: the next save compares values with its bytes."""
        with self._lock:
            self._baseline = _Baseline(prefix, locate(prefix, storage=storage).storage, None)

    def forget(self) -> None:
        """Drop the baseline: the next incremental save writes every value."""
        with self._lock:
            self._baseline = None

    def written(
        self,
        prefix: str,
        storage: Storage,
        tokens: dict[ValueKey, Token],
        held: Mapping[ValueKey, Token] | None = None,
    ) -> None:
        """Record the committed checkpoint ``prefix`` and the tokens of the values written.

        ``held``: the tokens of every value the process held, if taken (see :meth:`unchanged`).

        Never raises (the checkpoint is committed): a failure to read back its index is
        logged and only makes the next save write everything.
        """
        try:
            index = storage.read_bytes(index_filename(prefix))
            previous = PreviousCheckpoint(BundleIndex.parse(prefix, index), storage)
            sizes = tuple(storage.size(previous.data_file(s)) for s in range(previous.num_shards))
        except CheckpointError as exc:
            logger.warning(
                "Incremental saves: cannot read back %s (%s); the next save writes every value",
                prefix,
                exc,
            )
            self.forget()
            return
        with self._lock:
            self._baseline = _Baseline(
                prefix, storage, tokens, _digest(index), sizes, previous,
                {**held, **tokens} if held is not None else None,
            )  # fmt: skip

    def _load(self, storage: Storage) -> tuple[_Baseline, PreviousCheckpoint] | None:
        """The baseline and its index, if the checkpoint is still there as recorded."""
        baseline = self._baseline
        if baseline is None:
            return None
        if not _same_backend(baseline.storage, storage):
            logger.info(
                "Incremental save: %s is on another storage; writing every value", baseline.prefix
            )
            return None
        try:
            index = storage.read_bytes(index_filename(baseline.prefix))
            if baseline.index_digest is not None and _digest(index) != baseline.index_digest:
                logger.info(
                    "Incremental save: %s was replaced since it was written; writing every value",
                    baseline.prefix,
                )
                return None
            if baseline.parsed is not None:
                return baseline, baseline.parsed  # the same index bytes: parsed once
            parsed = BundleIndex.parse(baseline.prefix, index)
            return baseline, PreviousCheckpoint(parsed, storage)
        except CheckpointError as exc:
            logger.info(
                "Incremental save: previous checkpoint %s is unusable (%s); writing every value",
                baseline.prefix,
                exc,
            )
            return None


@dataclass(frozen=True, slots=True)
class IncrementalPlan:
    """What one incremental save writes and what it links (made at snapshot time)."""

    history: SaveHistory
    tokens: dict[ValueKey, Token]
    """Every value's token, recorded once the checkpoint is committed."""
    groups: tuple[tuple[str, tuple[ValueKey, ...]], ...]
    """(task, values) written together (the sharding policy cuts each group)."""
    linked: tuple[LinkedFile, ...]
    """Data files of the previous checkpoint reused whole."""
    previous: PreviousCheckpoint | None

    def shards(
        self, snapshot: SaveSnapshot, policy: Callable[[Sequence[ShardableTensor]], Iterable[Shard]]
    ) -> list[tuple[str, Shard]]:
        """The shards to write: the policy applied to each group."""
        by_key = {
            (st.checkpoint_key, st.slice_spec): st
            for tensors in snapshot.tensors_by_task.values()
            for st in tensors
        }
        shards_by_task: dict[str, list[Shard]] = {}
        for task, keys in self.groups:
            tensors = [by_key[key] for key in keys if key in by_key]
            if tensors:
                shards_by_task.setdefault(task, []).extend(policy(tensors))
        if not isinstance(policy, (ShardByTaskPolicy, MaxShardSizePolicy)):
            every = list(by_key.values())
            validate_shards(shards_by_task, every, policy_description(policy))
        return [(task, s) for task, shards in shards_by_task.items() for s in shards if s]

    def link(self, prefix: str, storage: Storage) -> int:
        """Create the linked bundle (every reused file) at ``prefix``; the bytes linked.

        Raises:
            CheckpointError: a reused data file vanished (the history is forgotten, so the
                next save writes everything).
        """
        if not self.linked:
            return 0
        assert self.previous is not None
        try:
            return link_bundle(self.linked, prefix, storage, self.previous.full)
        except CheckpointError:
            self.history.forget()
            raise


def plan_of(snapshot: SaveSnapshot) -> IncrementalPlan | None:
    """The incremental plan a snapshot carries, if any (only this module sets one)."""
    return cast("IncrementalPlan | None", snapshot.plan)


def prepare_incremental(
    history: SaveHistory | None,
    snapshot: SaveSnapshot,
    prefix: str,
    options: CheckpointOptions,
    storage: Storage | None = None,
    *,
    versions: Mapping[ValueKey, ValueVersion] | None = None,
    tokens: Mapping[ValueKey, Token] | None = None,
    detached: Collection[ValueKey] = (),
) -> SaveSnapshot:
    """``snapshot`` reduced to what an incremental save must write, with its plan.

    Unchanged: without ``options.incremental`` or a history, or if already planned.
    ``versions``: the values' exact versions, if taken when they were snapshotted (a
    distributed save plans after the ranks agree on who writes what, possibly on copies);
    by default they are taken now. ``tokens``: tokens taken earlier (at an async call); the
    values without one are hashed now. ``detached``: values found unchanged at the call and
    not copied, whose arrays may have changed since: they are never read; one that cannot be
    linked is written from the bytes of the previous checkpoint (equal to its value at the
    call: its digest matched).
    """
    if history is None or not options.incremental or plan_of(snapshot) is not None:
        return snapshot
    if snapshot.shards is not None:
        return snapshot  # a staged snapshot was planned before it was staged
    storage = locate(prefix, storage=storage or options.storage, fsync=options.fsync).storage
    trust = options.trust_immutable_arrays
    return _Planner(history, storage, versions, tokens, detached, trust=trust).plan(snapshot)


def record_incremental(
    snapshot: SaveSnapshot,
    prefix: str,
    storage: Storage,
    held: Mapping[ValueKey, Token] | None = None,
) -> None:
    """After the commit of ``prefix``: make it the baseline of the next incremental save.

    ``held``: tokens of values the process held but did not write (see
    :meth:`SaveHistory.unchanged`).
    """
    plan = plan_of(snapshot)
    if plan is not None:
        plan.history.written(prefix, _unwrap(storage), plan.tokens, held)


class _Planner:
    """One run of the planning steps 1-3 of the module docstring."""

    def __init__(
        self,
        history: SaveHistory,
        storage: Storage,
        versions: Mapping[ValueKey, ValueVersion] | None = None,
        tokens: Mapping[ValueKey, Token] | None = None,
        detached: Collection[ValueKey] = (),
        *,
        trust: bool = False,
    ) -> None:
        self.history = history
        self.trust = trust
        self.storage = storage
        self.versions = versions
        self.given = tokens or {}
        self.detached = frozenset(detached)
        self._reader: BundleReader | None = None

    def plan(self, snapshot: SaveSnapshot) -> SaveSnapshot:
        every = [st for tensors in snapshot.tensors_by_task.values() for st in tensors]
        given = self.given
        missing = [st for st in every if (st.checkpoint_key, st.slice_spec) not in given]
        tokens = value_tokens(missing, self.versions, trust=self.trust)
        if given:
            tokens.update(
                (k, given[k]) for k in ((st.checkpoint_key, st.slice_spec) for st in every)
                if k in given
            )  # fmt: skip
        loaded = self.history._load(self.storage)
        unchanged: dict[ValueKey, list[Piece]] = {}
        if loaded is not None:
            baseline, previous = loaded
            try:
                for st in every:
                    key = (st.checkpoint_key, st.slice_spec)
                    pieces = previous.pieces_of(st)
                    if pieces is not None and self._unchanged(st, tokens[key], baseline):
                        unchanged[key] = pieces
                linked = self._reusable(previous, unchanged, every, tokens)
                if self.detached:
                    snapshot = self._attach(snapshot, unchanged, linked, tokens)
            finally:
                if self._reader is not None:
                    self._reader.close()
        else:
            previous, linked = None, []
            if self.detached:
                try:
                    snapshot = self._attach(snapshot, unchanged, linked, tokens)
                finally:
                    if self._reader is not None:
                        self._reader.close()
        reused = {id(p) for f in linked for p in f.pieces}
        to_write: dict[str, list[ShardableTensor]] = {}
        groups = _Groups()
        for task, tensors in snapshot.tensors_by_task.items():
            out = to_write.setdefault(task, [])
            for st in tensors:
                key = (st.checkpoint_key, st.slice_spec)
                pieces = unchanged.get(key)
                if pieces is None:
                    out.append(st)
                    groups.add(task, st, stable=False)
                    continue
                rest = [p for p in pieces if id(p) not in reused]
                parts = [st] if len(rest) == len(pieces) else [piece_tensor(st, p) for p in rest]
                for part in parts:
                    out.append(part)
                    groups.add(task, part, stable=True)
        plan = IncrementalPlan(self.history, tokens, groups.result(), tuple(linked), previous)
        if linked:
            logger.info(
                "Incremental save: reusing %d data file(s), %d bytes, of %s; writing %d value(s)",
                len(linked),
                sum(f.nbytes for f in linked),
                previous.prefix if previous else "",
                sum(len(t) for t in to_write.values()),
            )
        return SaveSnapshot(to_write, plan=plan)

    def _attach(
        self,
        snapshot: SaveSnapshot,
        unchanged: Mapping[ValueKey, list[Piece]],
        linked: Sequence[LinkedFile],
        tokens: Mapping[ValueKey, Token],
    ) -> SaveSnapshot:
        """``snapshot`` with every detached value that is not linked read back from the
        previous checkpoint (its array may have changed since the call).

        Raises:
            CheckpointError: the previous checkpoint cannot give the value (gone, damaged, or
                not the bytes whose digest was taken at the call).
        """
        reused = {id(p) for f in linked for p in f.pieces}
        baseline = self.history._baseline
        out: dict[str, list[ShardableTensor]] = {}
        for task, tensors in snapshot.tensors_by_task.items():
            kept = out.setdefault(task, [])
            for st in tensors:
                key = (st.checkpoint_key, st.slice_spec)
                pieces = unchanged.get(key)
                if key not in self.detached or (
                    pieces is not None and all(id(p) in reused for p in pieces)
                ):
                    kept.append(st)
                    continue
                stored = self._stored(st, baseline.prefix) if baseline is not None else None
                token = tokens.get(key)
                if stored is None or (isinstance(token, bytes) and content_digest(stored) != token):
                    stored = self._live(st, token)
                if stored is None:
                    self.history.forget()  # the next save copies and writes every value
                    where = baseline.prefix if baseline is not None else "(none)"
                    raise CheckpointError(
                        f"value {st.checkpoint_key!r} was unchanged at the call of this async "
                        f"save and not copied, but the previous checkpoint {where} no longer "
                        "holds it; save again (the next save copies or writes every value)",
                        key=st.checkpoint_key,
                    )
                kept.append(st._replace(tensor=stored))
        return SaveSnapshot(out)

    @staticmethod
    def _live(st: ShardableTensor, token: Token | None) -> np.ndarray | None:
        """A copy of ``st``'s array if it still holds the value of the call (same digest),
        else None: the previous checkpoint could not give it (e.g. its file is damaged)."""
        if not isinstance(token, bytes):
            return None
        copy = np.array(st.tensor, copy=True)
        if content_digest(copy) != token:
            return None
        logger.warning(
            "Incremental save: %r could not be read back from the previous checkpoint; "
            "written from memory, which still holds the value of the call", st.checkpoint_key,
        )  # fmt: skip
        return copy

    def _stored(self, st: ShardableTensor, prefix: str) -> np.ndarray | None:
        """``st``'s value as stored in checkpoint ``prefix`` (checksums verified), or None."""
        try:
            if self._reader is None:
                self._reader = BundleReader(prefix, storage=self.storage)
            box = value_box(st)[1]
            stored = (
                self._reader.read(st.checkpoint_key)
                if box is None
                else self._reader.read_slice(st.checkpoint_key, box)
            )
        except CheckpointError:
            return None
        array = np.asarray(stored)
        if array.dtype != st.tensor.dtype or array.shape != st.tensor.shape:
            return None
        return array

    def _unchanged(self, st: ShardableTensor, token: Token, baseline: _Baseline) -> bool:
        if baseline.tokens is not None:
            return same_token(baseline.tokens.get((st.checkpoint_key, st.slice_spec)), token)
        # Restored from: compare with the stored bytes (read and checksum-verified).
        try:
            if self._reader is None:
                self._reader = BundleReader(baseline.prefix, storage=self.storage)
            box = value_box(st)[1]
            stored = (
                self._reader.read(st.checkpoint_key, copy=False)
                if box is None
                else self._reader.read_slice(st.checkpoint_key, box, copy=False)
            )
        except CheckpointError:
            return False
        live = token if isinstance(token, bytes) else content_digest(st.tensor)
        return content_digest(np.asarray(stored)) == live

    def _reusable(
        self,
        previous: PreviousCheckpoint,
        unchanged: dict[ValueKey, list[Piece]],
        every: Sequence[ShardableTensor],
        tokens: Mapping[ValueKey, Token],
    ) -> list[LinkedFile]:
        owned = {id(p) for pieces in unchanged.values() for p in pieces}
        sizes = self.history._baseline.file_sizes if self.history._baseline else None
        linked = []
        for shard_id in sorted(previous.pieces_by_shard):
            pieces = previous.pieces_by_shard[shard_id]
            if not all(id(p) in owned for p in pieces):
                continue
            size = previous.file_size(shard_id)
            if size is None or (sizes is not None and sizes[shard_id] != size):
                was = sizes[shard_id] if sizes is not None else None
                what = "gone" if size is None else f"{size} bytes, written as {was}"
                logger.warning(
                    "Incremental save: data file %s of the previous checkpoint is %s; not "
                    "linking it, its values are written from memory", previous.data_file(shard_id),
                    what,
                )  # fmt: skip
                continue  # gone, or not the file the index was written with
            linked.append(LinkedFile(previous.data_file(shard_id), list(pieces), size))
        if not linked or not _VERIFY_LINKED:
            return linked
        return self._verified(previous, linked, expected_digests(every, unchanged, tokens))

    def _verified(
        self, previous: PreviousCheckpoint, candidates: list[LinkedFile], expected: Expected
    ) -> list[LinkedFile]:
        """The ``candidates`` whose bytes check out; the others are logged and left out, so
        their values are written (from memory) instead of linked."""
        reasons = verify_files(
            candidates, self.storage, previous.full, big_endian=previous.big_endian,
            expected=expected,
        )  # fmt: skip
        good = []
        for linked_file, reason in zip(candidates, reasons):
            if reason is None:
                good.append(linked_file)
            else:
                logger.warning(
                    "Incremental save: data file %s of the previous checkpoint is damaged "
                    "(%s); not linking it, its values are written from memory",
                    linked_file.source, reason,
                )  # fmt: skip
        return good


class _Groups:
    """Step 3: which values are written together."""

    def __init__(self) -> None:
        self._shared: dict[tuple[str, bool], list[ValueKey]] = {}
        self._own: list[tuple[str, tuple[ValueKey, ...]]] = []

    def add(self, task: str, st: ShardableTensor, *, stable: bool) -> None:
        key = (st.checkpoint_key, st.slice_spec)
        if st.tensor.nbytes >= _OWN_FILE_BYTES and len(self._own) < _MAX_OWN_FILES:
            self._own.append((task, (key,)))
        else:
            self._shared.setdefault((task, stable), []).append(key)

    def result(self) -> tuple[tuple[str, tuple[ValueKey, ...]], ...]:
        shared = [(task, tuple(keys)) for (task, _), keys in sorted(
            self._shared.items(), key=lambda item: not item[0][1]
        )]  # fmt: skip
        return tuple([*shared, *self._own])
