"""``DistributedSaver``: every rank writes its own shards, one rank merges and commits.

The protocol of one save to ``prefix`` (tf-checkpoint-format.md §11, spread over ranks). Every
step is taken by every rank, in order; a rank that fails locally still takes part and reports
its error, so all ranks fail together and quickly:

1. *plan*: the coordinator prepares the commit (creates the temporary folder under a random
   name, runs registered savers); every rank sends it the list of values it holds (key, slice,
   dtype, shape, bytes) and the prefix; the coordinator checks them against each other and
   tells each rank which of its values to write (``plan.assign_writers``: its own slices, plus a
   byte-balanced share of the replicated values).
2. *shard*: each rank applies the sharding policy to its values; the ranks exchange their shard
   counts, and the coordinator hands out the names ``part-SSSSS-of-NNNNN`` in the temporary place
   (shards are numbered rank by rank). An incremental save (``CheckpointOptions(incremental=True)``,
   docs/incremental.md) first runs the single-process engine (``trackpoint.saving.incremental``)
   on the values this rank writes: unchanged values whose data files this rank wrote last time
   are not written again, and those files become one more shard of this rank, a bundle of hard
   links (``trackpoint.saving.linking``). In step 1 each rank claims the values it wrote last time
   and the coordinator gives them back to it, so a rank keeps reusing its own files.
3. *write*: each rank writes its shards (a thread pool, as a single-process save does), links
   the files it reuses, and reports success or its error to the coordinator, with the content
   digests of its *replicas* (values other ranks hold too, as the plan told it).
4. *commit*: the coordinator refuses a replica that differs between ranks (it is written once:
   one rank's value would be kept silently; ``plan.check_replicas`` names it), then merges the
   shard indexes into ``prefix`` (data files renamed into
   place, the index written last: the commit point) and runs its write callbacks (the state
   file); then it tells every rank the result and the checkpoint's file sizes. The other ranks
   run their own write callbacks, every rank records its figures (:func:`_record`) and reports
   ``"commit"`` with them (an incremental save also records the checkpoint as the next one's
   baseline), and all return ``prefix`` or raise.

Any failure before the commit point aborts on the coordinator (everything this save wrote is
removed; an earlier checkpoint stays the latest). If the coordinator itself dies, its temporary
folder is removed by the next save in that directory (see :mod:`trackpoint.saving.commit`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.distributed.collective import Collective, CollectiveError
from trackpoint.distributed.plan import (
    TensorInfo,
    assign_writers,
    check_replicas,
    describe,
    replica_digests,
    replicas,
)
from trackpoint.errors import (
    CheckpointError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from trackpoint.metrics import registry as metrics
from trackpoint.saving import (
    CheckpointOptions,
    MaxShardSizePolicy,
    MultiDeviceSaver,
    ProgressEvent,
    SaveSnapshot,
    Shard,
    ShardableTensor,
    ShardByTaskPolicy,
)
from trackpoint.saving.change_tracking import (
    Token,
    ValueKey,
    ValueVersion,
    value_tokens,
    value_versions,
)
from trackpoint.saving.commit import AtomicCommit
from trackpoint.saving.incremental import (
    IncrementalPlan,
    SaveHistory,
    plan_of,
    prepare_incremental,
    record_incremental,
)
from trackpoint.saving.progress import WrittenFiles, committed_sizes, write_stats
from trackpoint.saving.saver import SerializedTensors
from trackpoint.saving.shard_validation import policy_description, validate_shards
from trackpoint.saving.shard_writer import payload_bytes, write_shards
from trackpoint.storage import Storage, locate

__all__ = ["DistributedSaver", "error_message", "raise_collected"]

logger = logging.getLogger(__name__)

_DEFAULT_MAX_IO_THREADS = 4
_ERROR_TYPES: dict[str, type[CheckpointError]] = {
    cls.__name__: cls
    for cls in (
        CheckpointError, DataLossError, FailedPreconditionError, InvalidArgumentError,
        NotFoundError,
    )
}


def error_message(exc: BaseException | None, rank: int) -> dict[str, Any] | None:
    """A rank's error as a message for the other ranks (None: no error)."""
    if exc is None:
        return None
    return {"rank": rank, "type": type(exc).__name__, "message": str(exc)}


def raise_collected(
    errors: list[dict[str, Any]], local: BaseException | None, what: str, path: str
) -> NoReturn:
    """Raise the ranks' errors: this rank's own exception if it had one, else a summary.

    The summary has the first failing rank's trackpoint error type (``CheckpointError`` for
    anything else), so every rank raises the same kind of error.
    """
    if local is not None:
        raise local
    ordered = sorted(errors, key=lambda e: e["rank"])
    listed = "; ".join(f"rank {e['rank']}: {e['type']}: {e['message']}" for e in ordered[:4])
    if len(ordered) > 4:
        listed += f"; and {len(ordered) - 4} more rank(s)"
    cls = _ERROR_TYPES.get(ordered[0]["type"], CheckpointError)
    raise cls(f"{what} failed on {len(ordered)} rank(s): {listed}", path=path)


class DistributedSaver(MultiDeviceSaver):
    """A ``MultiDeviceSaver`` whose ``save`` is one step of a save by every rank of a group.

    Every rank builds one from its own values and calls ``save`` (or, through ``AsyncWriter``,
    ``snapshot`` then ``save_snapshot``) with the same prefix. ``restore`` is the inherited,
    local one.

    Args:
        serialized_tensors: this rank's values, as for ``MultiDeviceSaver``.
        registered_savers: objects of registered savers; only the coordinator's are saved.
        collective: the ranks taking part.
        coordinator: the rank that merges and commits (its write callbacks run first).
        graph_keys: on the coordinator, the checkpoint keys of its object graph (every rank's
            values must be among them).
        error: an error that happened while gathering this rank's values; the save fails on
            every rank with it.
    """

    def __init__(
        self,
        serialized_tensors: SerializedTensors,
        registered_savers: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        collective: Collective,
        coordinator: int = 0,
        graph_keys: Collection[str] | None = None,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(serialized_tensors, registered_savers)
        self.collective = collective
        self.coordinator = coordinator
        self.graph_keys = graph_keys
        self.error = error
        self.rank_history: SaveHistory | None = None
        self.versions: dict[ValueKey, ValueVersion] | None = None

    def use_history(self, history: SaveHistory) -> bool:
        """Let saves with ``options.incremental`` reuse the data files this rank wrote.

        The inherited :attr:`history` stays None: the plan is made in the save, once the ranks
        have agreed on which values this rank writes. The values' exact versions are taken at
        the call, by :meth:`snapshot`; an async save also hashes this rank's values at the call
        and copies only those that changed (:class:`_RankSnapshot`).
        """
        self.rank_history = history
        return True

    def snapshot(self) -> SaveSnapshot:
        """Evaluate this rank's values; an error is kept for the save instead of raised.

        Raising here would leave the other ranks waiting in the save's first exchange.
        """
        if self.error is None:
            try:
                snapshot = super().snapshot()
                if self.rank_history is not None:  # exact versions name the values of now
                    self.versions = value_versions(
                        [st for sts in snapshot.tensors_by_task.values() for st in sts]
                    )
                    return _RankSnapshot(
                        snapshot.tensors_by_task, self.rank_history, self.versions
                    )
                return snapshot
            except Exception as exc:  # reported to every rank by save_snapshot
                self.error = exc
        return SaveSnapshot({})

    def save_snapshot(
        self,
        snapshot: SaveSnapshot,
        prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage: Storage | None = None,
        timing: Any = None,
    ) -> str:
        """Take part in saving ``prefix`` with the other ranks (see the module docstring).

        ``timing`` (``trackpoint.metrics.begin_write()``; by default this call) times this
        rank's part: see :func:`_record` for what each rank records.

        Returns:
            ``prefix``, on every rank, once the checkpoint is committed.

        Raises:
            InvalidArgumentError: the ranks' values do not fit together (names the key), or a
                value cannot be stored; raised on every rank.
            CheckpointError: a rank failed or died; nothing was committed.
        """
        started = time.perf_counter()
        timing = timing or metrics.begin_write()
        options = options or CheckpointOptions()
        prefix_str = fspath(prefix)
        storage = locate(
            prefix_str, storage=storage or options.storage, fsync=options.fsync
        ).storage
        return _SaveRun(self, snapshot, prefix_str, options, storage, timing, started).run()


@dataclass(frozen=True, slots=True)
class _RankSnapshot(SaveSnapshot):
    """One rank's values for an incremental save; an async save's copy skips unchanged ones.

    The plan is made in the save, after the ranks agree on who writes what, so an async save
    decides at the call only what it can alone: :meth:`copy` (called at the call) hashes every
    value this rank holds and copies only those that differ from what this rank wrote last
    time. The others stay *detached*: the owner may change them once the call returns, so the
    plan never reads them (their tokens are the call's); they are linked from the previous
    checkpoint, or, if they must be written, read back from it (same bytes: same digest).
    """

    history: SaveHistory | None = None
    versions: Mapping[ValueKey, ValueVersion] | None = None
    tokens: Mapping[ValueKey, Token] | None = None
    """The values' tokens taken at the call (async saves), else None."""
    detached: frozenset[ValueKey] = frozenset()
    """Values unchanged at the call and not copied."""
    _decided: dict[str, Any] = field(default_factory=dict, compare=False)

    def _decide(self) -> tuple[Mapping[ValueKey, Token], frozenset[ValueKey]]:
        """(every value's token at the call, those unchanged since this rank's last save)."""
        if self.tokens is not None:  # a copy: decided at the call
            return self.tokens, self.detached
        if "tokens" not in self._decided and self.history is not None:
            every = [st for sts in self.tensors_by_task.values() for st in sts]
            tokens = value_tokens(every, self.versions)
            self._decided["tokens"] = tokens
            self._decided["unchanged"] = self.history.unchanged(tokens)
        return self._decided.get("tokens", {}), self._decided.get("unchanged", frozenset())

    @property
    def nbytes(self) -> int:
        # docstring inherited: the bytes a copy takes (unchanged values are not copied)
        skip = self._decide()[1]
        return sum(
            st.tensor.nbytes
            for sts in self.tensors_by_task.values()
            for st in sts
            if (st.checkpoint_key, st.slice_spec) not in skip
        )

    def copy(
        self, buffers: MutableMapping[tuple[str, str], np.ndarray] | None = None
    ) -> SaveSnapshot:
        # docstring inherited: only the values that changed since this rank's last save
        tokens, unchanged = self._decide()
        changed = {
            task: [st for st in sts if (st.checkpoint_key, st.slice_spec) not in unchanged]
            for task, sts in self.tensors_by_task.items()
        }
        copies = iter(
            st for sts in SaveSnapshot(changed).copy(buffers).tensors_by_task.values()
            for st in sts
        )  # fmt: skip
        merged = {
            task: [
                st if (st.checkpoint_key, st.slice_spec) in unchanged else next(copies)
                for st in sts
            ]
            for task, sts in self.tensors_by_task.items()
        }
        if tokens:
            logger.debug("Async incremental save: %d value(s) unchanged at the call, not "
                         "copied", len(unchanged))
        return _RankSnapshot(merged, self.history, self.versions, tokens, unchanged)

    def call_tokens(self) -> Mapping[ValueKey, Token] | None:
        """The tokens taken at the call, if they were (an async save's :meth:`copy`, or its
        :attr:`nbytes` before it saved synchronously); None: the plan hashes its values."""
        return self.tokens if self.tokens is not None else self._decided.get("tokens")


def _record(stats: metrics.WriteStats, timing: metrics.WriteTiming, *, coordinator: bool) -> None:
    """Record one rank's figures of a committed distributed save.

    The coordinator records the whole save as a single-process save does (its durations, and
    the merged checkpoint's size, data files and bytes), so the job's checkpoints, bytes and
    shards are counted once however many ranks there are. Every other rank records only its
    own durations: the time it was blocked (and, for async saves, its background time) and
    the training time before the save; for a sync save it restarts its training clock.
    """
    if coordinator:
        metrics.record_write(stats)
        return
    metrics.record_duration(
        metrics.WRITE_DURATION, stats.blocking_seconds, mode=stats.mode, phase="blocking"
    )
    if stats.mode == "async":
        metrics.record_duration(
            metrics.WRITE_DURATION, stats.background_seconds, mode="async", phase="background"
        )
    else:
        metrics.end_blocking(timing)  # the save is over here: the training clock restarts
    if stats.training_seconds is not None:
        metrics.record_duration(metrics.TRAINING_TIME_BETWEEN_WRITES, stats.training_seconds)


class _SaveRun:
    """The state of one rank during one distributed save."""

    def __init__(
        self, saver: DistributedSaver, snapshot: SaveSnapshot, prefix: str,
        options: CheckpointOptions, storage: Storage, timing: metrics.WriteTiming,
        started: float,
    ) -> None:
        self.saver = saver
        self.collective = saver.collective
        self.rank = saver.collective.rank
        self.is_coordinator = self.rank == saver.coordinator
        self.prefix = prefix
        self.options = options
        self.storage = storage
        self.tensors = [st for sts in snapshot.tensors_by_task.values() for st in sts]
        # An async incremental save's copy: tokens taken at the call, unchanged values uncopied.
        self.call_tokens = (
            snapshot.call_tokens() if isinstance(snapshot, _RankSnapshot) else None
        )
        self.detached = snapshot.detached if isinstance(snapshot, _RankSnapshot) else frozenset()
        self.error: BaseException | None = saver.error
        self.commit: AtomicCommit | None = None
        self.timing = timing
        self.started = started
        self.sharding_seconds = 0.0
        self.history = saver.rank_history if options.incremental else None
        self.plan: IncrementalPlan | None = None  # this rank's incremental plan
        self.incremental: SaveSnapshot | None = None
        # On the coordinator: every rank's values and which of them several ranks hold.
        self.infos: list[list[TensorInfo]] = []
        self.replicas: list[list[int]] = []

    def run(self) -> str:
        try:
            return self._run()
        except CollectiveError as exc:
            self._abort()
            raise CollectiveError(
                f"Saving checkpoint {self.prefix} failed, nothing was committed: {exc}",
                path=self.prefix,
            ) from exc
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        if self.commit is not None:
            self.commit.abort()

    def _check(self, errors: list[dict[str, Any]]) -> None:
        errors = [e for e in errors if e]
        if errors:
            raise_collected(errors, self.error, f"Saving checkpoint {self.prefix}", self.prefix)

    def _run(self) -> str:
        coordinator = self.saver.coordinator
        # 1. plan
        if self.is_coordinator and self.error is None:
            try:
                self.commit = AtomicCommit(self.storage, self.prefix)
                self.commit.prepare()
                # Registered savers write before the shards (TF's contract); the coordinator's
                # objects stand for every rank's.
                registered = self.saver._run_registered_save_fns(self.prefix)
                self.commit.add_foreign_prefixes(registered)
            except Exception as exc:
                self.error = exc
        infos = describe(self.tensors) if self.error is None else []
        message = {
            "prefix": self.prefix,
            "error": error_message(self.error, self.rank),
            "infos": [info.to_json() for info in infos],
            "claims": self._claims() if infos else [],
        }
        gathered = self.collective.gather(message, coordinator)
        replies = self._plan(gathered) if gathered is not None else None
        reply = self.collective.scatter(replies, coordinator)
        self._check(reply["errors"])

        # 2. shard
        mine = [self.tensors[i] for i in reply["write"]]
        shards: list[Shard] = []
        try:
            shards = self._shard(mine)
        except Exception as exc:
            self.error = exc
        linked = self.plan is not None and bool(self.plan.linked)
        counts = self.collective.all_gather(
            {"count": len(shards) + linked, "error": error_message(self.error, self.rank)}
        )
        self._check([c["error"] for c in counts])
        total = sum(c["count"] for c in counts)
        first = sum(c["count"] for c in counts[: self.rank])
        names = None
        if self.commit is not None:
            names = [self.commit.shard_prefix(i, total) for i in range(total)]
        names = self.collective.broadcast(names, coordinator)

        # 3. write; digests of the values other ranks hold too, for the coordinator to compare
        written = 0
        digests: list[list[Any]] = []
        try:
            digests = replica_digests(self.tensors, reply["replicas"], self.call_tokens)
            written = self._write(shards, names, first)
        except Exception as exc:
            self.error = exc
        statuses = self.collective.gather(
            {"error": error_message(self.error, self.rank), "bytes": written,
             "replicas": digests},
            coordinator,
        )  # fmt: skip

        # 4. commit
        result: dict[str, Any] | None = None
        if statuses is not None:
            result = self._commit(statuses, names)
        result = self.collective.broadcast(result, coordinator)
        self._check(result["errors"])
        if self.incremental is not None:  # committed: the next incremental save compares to it
            record_incremental(self.incremental, self.prefix, self.storage, self.call_tokens)
        if not self.is_coordinator:
            # The checkpoint is committed: this rank's own callbacks (its CheckpointManager
            # follows the state file the coordinator's callbacks wrote).
            self.options.run_write_callbacks(self.prefix)
        self._finish(result, len(names))
        return self.prefix

    def _finish(self, result: dict[str, Any], num_shards: int) -> None:
        """Record this rank's figures and report ``"commit"`` with them."""
        files = tuple(int(n) for n in result["files"])
        policy = policy_description(self.options.sharding_policy or ShardByTaskPolicy())
        written = WrittenFiles(
            len(files), result["bytes"], files, result["index"] + sum(files), policy,
            self.sharding_seconds,
        )
        stats = write_stats(self.prefix, written, self.timing, self.started)
        _record(stats, self.timing, coordinator=self.is_coordinator)
        nbytes = result["bytes"]
        self._progress("commit", num_shards, num_shards, nbytes, nbytes, stats=stats)

    def _plan(self, gathered: list[Any]) -> list[dict[str, Any]]:
        """On the coordinator: check the ranks' plans and assign writers (or an error)."""
        world = len(gathered)
        error = next((m["error"] for m in gathered if m["error"]), None)
        if error is None:
            prefixes = {m["prefix"] for m in gathered}
            try:
                if len(prefixes) > 1:
                    listed = ", ".join(f"rank {r}: {m['prefix']}" for r, m in enumerate(gathered))
                    raise InvalidArgumentError(
                        f"the ranks are saving different checkpoints ({listed}); every rank "
                        "must call save with the same prefix (and the same save_counter)",
                        path=self.prefix,
                    )
                infos = [[TensorInfo.from_json(v) for v in m["infos"]] for m in gathered]
                writes = assign_writers(
                    infos, coordinator=self.rank, graph_keys=self.saver.graph_keys,
                    preferred=[m.get("claims", []) for m in gathered],
                )
                self.infos, self.replicas = infos, replicas(infos)
                return [
                    {"errors": [], "write": w, "replicas": r}
                    for w, r in zip(writes, self.replicas)
                ]
            except CheckpointError as exc:
                self.error = exc
                error = error_message(exc, self.rank)
        # The same errors for everyone: all ranks fail alike before writing anything.
        errors = [m["error"] for m in gathered if m["error"]] or [error]
        return [{"errors": errors, "write": [], "replicas": []} for _ in range(world)]

    def _claims(self) -> list[int]:
        """Indices of this rank's values that it wrote in the previous (incremental) save."""
        if self.history is None:
            return []
        recorded = self.history.recorded()
        if not recorded:
            return []
        return [
            i for i, st in enumerate(self.tensors)
            if (st.checkpoint_key, st.slice_spec) in recorded
        ]

    def _shard(self, tensors: list[ShardableTensor]) -> list[Shard]:
        policy = self.options.sharding_policy or ShardByTaskPolicy()
        if self.history is not None:
            # Incremental: the single-process engine, on the values this rank writes.
            self.incremental = prepare_incremental(
                self.history, SaveSnapshot({"": tensors}), self.prefix, self.options,
                self.storage, versions=self.saver.versions or {}, tokens=self.call_tokens,
                detached=self.detached & {(st.checkpoint_key, st.slice_spec) for st in tensors},
            )  # fmt: skip
            self.plan = plan_of(self.incremental)
        began = time.perf_counter()
        if self.plan is not None and self.incremental is not None:
            shards = [s for _, s in self.plan.shards(self.incremental, policy)]
        else:
            shards = [shard for shard in policy(tensors) if shard]
            if not isinstance(policy, (ShardByTaskPolicy, MaxShardSizePolicy)):
                validate_shards({"": shards}, tensors, policy_description(policy))
        self.sharding_seconds = time.perf_counter() - began
        if self.is_coordinator and not shards and not (self.plan and self.plan.linked):
            shards = [{}]  # the coordinator always writes (at least the object graph)
        return shards

    def _write(self, shards: list[Shard], names: list[str], first: int) -> int:
        """Write this rank's shards (``names[first:]`` on), then link the data files it reuses
        as one more bundle; returns the payload bytes written."""
        if self.plan is not None and self.plan.linked:
            self.plan.link(names[first + len(shards)], self.storage)
        if not shards:
            return 0
        sizes = [payload_bytes(shard) for shard in shards]
        workers = self.options.num_io_threads or min(_DEFAULT_MAX_IO_THREADS, len(shards))
        mine = names[first : first + len(shards)]
        jobs = [(name, shard, self.storage) for name, shard in zip(mine, shards)]
        done = 0
        for count, index in enumerate(write_shards(jobs, workers), start=1):
            done += sizes[index]
            self._progress("write", count, len(shards), done, sum(sizes),
                           shard_id=first + index, shard_bytes=sizes[index])
        return sum(sizes)

    def _commit(self, statuses: list[Any], names: list[str]) -> dict[str, Any]:
        """On the coordinator: merge and commit if every rank wrote its shards."""
        errors = [s["error"] for s in statuses if s["error"]]
        size = sum(s["bytes"] for s in statuses)
        if errors:
            return {"errors": errors, "bytes": 0}
        assert self.commit is not None
        try:
            check_replicas(self.infos, self.replicas, [s["replicas"] for s in statuses])
            self.commit.commit([*self.commit.foreign_prefixes, *names])
        except Exception as exc:
            self.error = exc
            return {"errors": [error_message(exc, self.rank)], "bytes": 0}
        logger.info("Saved checkpoint %s from %d rank(s): %d shards, %d bytes", self.prefix,
                    self.collective.world_size, len(names), size)
        files, index = committed_sizes(self.commit)  # for every rank's figures
        done = {"errors": [], "bytes": size, "files": list(files), "index": index}
        try:
            self.options.run_write_callbacks(self.prefix)
        except Exception as exc:
            self.error = exc
            message = error_message(exc, self.rank)
            assert message is not None
            message["message"] = (
                f"the checkpoint was committed, but a write callback failed: {message['message']}"
            )
            done["errors"] = [message]
        return done

    def _progress(
        self, phase: str, done: int, total: int, bytes_done: int, bytes_total: int,
        **extra: Any,
    ) -> None:
        if self.options.progress is not None:
            self.options.progress(
                ProgressEvent(self.prefix, phase, done, total, bytes_done, bytes_total, **extra)
            )
