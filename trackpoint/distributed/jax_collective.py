"""``JaxCollective``: the messages of a distributed save carried by ``jax.distributed``.

A multi-process JAX job already runs a coordination service (``jax.distributed.initialize``
starts it in process 0 and connects every process to it). Its key-value store carries
trackpoint's small JSON messages, so a JAX job needs no other transport (no torch, no gloo
group, no sockets of ours): each exchange writes every sender's message under a key of its
own and the receivers wait for the keys they need.

Keys: ``trackpoint/collective/<group>/<call>/...``, where ``<group>`` numbers the collectives
this process created (in creation order: create them in the same order on every process, as
process groups are) and ``<call>`` numbers the group's exchanges (every process makes the same
calls in the same order, the collective contract). A call's keys are deleted by the last
process done with them (a counter under the call's key counts them), so the store does not
grow with the number of saves.

A process that does not write its message within ``timeout`` seconds makes the others'
call fail with a :class:`~trackpoint.errors.CollectiveError` naming the processes whose
messages are missing. The process that gives up announces it under
``trackpoint/collective/<group>/abort``; every waiting process checks that key each second,
so the others fail at once with the same reason instead of timing out on the process that
gave up (a save then fails everywhere within about a second of the first timeout).

JAX itself terminates every process some time after one has died (the coordination service
stops receiving the dead one's heartbeats; ``heartbeat_timeout_seconds`` of
``jax.distributed.initialize``); with a ``timeout`` below that delay the survivors fail with
trackpoint's error first. Either way nothing is committed.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from typing import Any

from trackpoint.distributed.collective import Collective
from trackpoint.errors import CollectiveError, FailedPreconditionError

__all__ = ["JaxCollective", "jax_distributed_client", "jax_distributed_initialized"]

_ROOT = "trackpoint/collective"
_POLL = 1.0
"""Seconds between checks for a failure another process announced, while waiting."""
_GRACE = 2 * _POLL
"""Extra seconds a process waiting for one sender (a broadcast, a scatter) gives it: the
sender is usually waiting for the others itself, and when it gives up it names the process
that is really missing, which the receivers then report instead of blaming the sender."""
# Creation order of this process's collectives: explicit registry of one counter (STYLE §1).
_groups = itertools.count()
_groups_lock = threading.Lock()


def _client_or_none() -> Any:
    """The coordination service client of ``jax.distributed``, or None (never imports jax)."""
    if "jax" not in sys.modules:  # jax.distributed cannot be initialized without jax imported
        return None
    from jax._src.distributed import global_state

    return global_state.client


def jax_distributed_initialized() -> bool:
    """True when ``jax.distributed.initialize`` ran in this process with several processes."""
    if _client_or_none() is None:
        return False
    from jax._src.distributed import global_state

    return int(global_state.num_processes) > 1


def jax_distributed_client() -> Any:
    """The ``DistributedRuntimeClient`` of ``jax.distributed``.

    Raises:
        FailedPreconditionError: ``jax.distributed.initialize`` was not called.
    """
    client = _client_or_none()
    if client is None:
        raise FailedPreconditionError(
            "jax.distributed is not initialized: call jax.distributed.initialize(...) on every "
            "process before creating a DistributedCheckpoint with backend='jax'"
        )
    return client


def _encode(message: Any) -> str:
    return json.dumps(message, separators=(",", ":"))


class JaxCollective(Collective):
    """Messages between the processes of a ``jax.distributed`` job, through its key-value store.

    Ranks are JAX process indices (``jax.process_index()``), the world is every process of the
    job. Creating one exchanges nothing, but every process must create its collectives in the
    same order (their keys are numbered by creation). Thread-safe in the sense a collective
    needs: one thread at a time uses an instance (an async save's background thread, or the
    caller).

    Args:
        timeout: seconds a process waits for the others' messages in one exchange.
        client: the coordination service client (default: the one ``jax.distributed`` made);
            tests pass their own.
        rank: this process's index (default: ``jax.process_index()``).
        world_size: number of processes (default: ``jax.process_count()``).
        name: the namespace of this collective's keys, the same on every process (default:
            the collective's number in this process's creation order).

    Raises:
        FailedPreconditionError: ``jax.distributed`` is not initialized and no client is given.

    Example::

        jax.distributed.initialize(coordinator_address="10.0.0.1:1234", num_processes=4,
                                   process_id=index)
        ckpt = tpd.DistributedCheckpoint(params=params, backend="jax")   # or automatic
    """

    def __init__(
        self,
        *,
        timeout: float = 1800.0,
        client: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        name: str | None = None,
    ) -> None:
        if client is None:
            client = jax_distributed_client()
            from jax._src.distributed import global_state

            rank = int(global_state.process_id) if rank is None else rank
            world_size = int(global_state.num_processes) if world_size is None else world_size
        if rank is None or world_size is None:
            raise FailedPreconditionError(
                "a JaxCollective with its own client needs rank and world_size"
            )
        self._client = client
        self._rank = int(rank)
        self._world_size = int(world_size)
        self.timeout = float(timeout)
        if name is None:
            with _groups_lock:
                name = str(next(_groups))
        self._group = name
        self._abort_key = f"{_ROOT}/{name}/abort"
        self._calls = itertools.count()

    @property
    def rank(self) -> int:
        # docstring inherited
        return self._rank

    @property
    def world_size(self) -> int:
        # docstring inherited
        return self._world_size

    # -- one call ------------------------------------------------------------------------------
    def _call(self) -> str:
        return f"{_ROOT}/{self._group}/{next(self._calls)}"

    def _put(self, key: str, message: Any) -> None:
        try:
            self._client.key_value_set(key, _encode(message))
        except Exception as exc:  # JaxRuntimeError: the coordination service is gone
            raise self._abort(f"sending a message failed ({exc})") from exc

    def _get(self, call: str, names: list[tuple[str, int]], deadline: float) -> list[Any]:
        """The messages under ``call/<name>`` (sent by the paired ranks), waiting until
        ``deadline``; the error names every rank whose message is missing."""
        return [json.loads(self._wait(call, name, names, deadline)) for name, _ in names]

    def _wait(self, call: str, name: str, names: list[tuple[str, int]], deadline: float) -> str:
        """One message, waited for in slices of at most ``_POLL`` seconds: between them, a
        failure another process announced (:meth:`_abort`) ends the wait at once."""
        while True:
            remaining = deadline - time.monotonic()
            window_ms = max(1, int(min(remaining, _POLL) * 1000))
            try:
                return str(self._client.blocking_key_value_get(f"{call}/{name}", window_ms))
            except Exception as exc:  # JaxRuntimeError: DEADLINE_EXCEEDED, UNAVAILABLE
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if "DEADLINE_EXCEEDED" not in text:  # the coordination service is gone
                    raise self._abort(f"the coordination service failed ({text})") from exc
                announced = self._announced()
                if announced is not None:
                    raise self._failed(f"process {announced}") from exc
                if time.monotonic() >= deadline:
                    missing = self._missing(call, names)
                    who = f"process(es) {', '.join(str(r) for r in missing) or '?'}"
                    raise self._abort(
                        f"{who} did not reach the same call within {self.timeout:g} s"
                    ) from exc

    def _announced(self) -> str | None:
        """The failure another process of this collective announced, if any."""
        try:
            return str(self._client.key_value_try_get(self._abort_key))
        except Exception:  # NOT_FOUND: nobody failed
            return None

    def _abort(self, what: str) -> CollectiveError:
        """The error of this process's failed exchange, announced to the others so that they
        stop waiting for it (the collective is unusable afterwards, as a process group is)."""
        error = self._failed(what)
        try:
            self._client.key_value_set(
                self._abort_key, f"{self._rank} failed: {what}", allow_overwrite=True
            )
        except Exception as exc:  # the service is gone: the others fail on their own
            del exc
        return error

    def _missing(self, call: str, names: list[tuple[str, int]]) -> list[int]:
        missing = []
        for name, sender in names:
            try:
                self._client.key_value_try_get(f"{call}/{name}")
            except Exception:  # NOT_FOUND (or the service is gone: count it missing)
                missing.append(sender)
        return sorted(set(missing))

    def _done(self, call: str) -> None:
        """Count this process out of ``call``; the last one deletes the call's keys."""
        try:
            if self._client.key_value_increment(f"{call}/done", 1) >= self._world_size:
                self._client.key_value_delete(call)
        except Exception as exc:  # cleanup only: a leftover key costs a few bytes
            del exc

    def _failed(self, what: str) -> CollectiveError:
        return CollectiveError(
            f"process {self._rank}: exchanging messages over jax.distributed with the other "
            f"{self._world_size - 1} process(es) failed: {what}. A process died, raised outside "
            "trackpoint, or skipped the call; check the other processes' logs"
        )

    # -- the exchanges ---------------------------------------------------------------------------
    def all_gather(self, message: Any) -> list[Any]:
        # docstring inherited
        call = self._call()
        deadline = time.monotonic() + self.timeout
        self._put(f"{call}/{self._rank}", message)
        out = self._get(call, [(str(r), r) for r in range(self._world_size)], deadline)
        self._done(call)
        return out

    def broadcast(self, message: Any, src: int) -> Any:
        # docstring inherited
        call = self._call()
        deadline = time.monotonic() + self.timeout
        if self._rank == src:
            self._put(f"{call}/b", message)
            out = json.loads(_encode(message))
        else:
            (out,) = self._get(call, [("b", src)], deadline + _GRACE)
        self._done(call)
        return out

    def gather(self, message: Any, dst: int) -> list[Any] | None:
        # docstring inherited
        call = self._call()
        deadline = time.monotonic() + self.timeout
        self._put(f"{call}/{self._rank}", message)
        out = None
        if self._rank == dst:
            out = self._get(call, [(str(r), r) for r in range(self._world_size)], deadline)
        self._done(call)
        return out

    def scatter(self, messages: list[Any] | None, src: int) -> Any:
        # docstring inherited
        call = self._call()
        deadline = time.monotonic() + self.timeout
        if self._rank == src:
            assert messages is not None and len(messages) == self._world_size
            for rank, item in enumerate(messages):
                if rank != src:
                    self._put(f"{call}/{rank}", item)
            out = json.loads(_encode(messages[src]))
        else:
            (out,) = self._get(call, [(str(self._rank), src)], deadline + _GRACE)
        self._done(call)
        return out

    def __repr__(self) -> str:
        return (
            f"JaxCollective(process {self._rank} of {self._world_size}, group {self._group}, "
            f"timeout {self.timeout:g} s)"
        )
