"""The messages ranks exchange during a distributed save or restore, and who carries them.

A :class:`Collective` moves small JSON values (plans, shard counts, file names, errors) between
the ranks of a group: ``all_gather`` and ``broadcast``, nothing else. Tensor bytes never go
through it; every rank reads and writes the storage itself. JSON rather than pickle: a message
is plain data and decoding one never runs code.

Call order: every rank calls the same methods in the same order (SPMD). A rank that dies or
stops calling makes the others' call fail, quickly when its connections close, otherwise after
``timeout`` seconds; the failure is a :class:`~trackpoint.errors.CheckpointError`.

Implementations: :class:`~trackpoint.distributed.torch_collective.TorchCollective` (a gloo
process group; jobs on NCCL get a gloo side group; its own module, the only one here that
needs torch), :class:`~trackpoint.distributed.jax_collective.JaxCollective` (the key-value
store of ``jax.distributed``), :class:`LocalCollective` (one process) and the test double
:class:`ThreadGroup`, whose ranks are threads of one process.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from typing import Any

from trackpoint.errors import CollectiveError

__all__ = ["Collective", "CollectiveError", "LocalCollective", "ThreadGroup", "decode", "encode"]


def encode(message: Any) -> bytes:
    """A message as the bytes every collective sends: compact JSON in UTF-8."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8")


def decode(data: bytes) -> Any:
    """The message ``data`` (from :func:`encode`) holds."""
    return json.loads(data.decode("utf-8"))


class Collective(ABC):
    """Exchange of JSON values between the ranks of one group (see the module docstring)."""

    timeout: float = 1800.0
    """Seconds a rank waits for the others in one exchange."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank in the group, ``0 <= rank < world_size``."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of ranks in the group."""

    @abstractmethod
    def all_gather(self, message: Any) -> list[Any]:
        """Every rank's ``message``, indexed by rank.

        Raises:
            CheckpointError: a rank died, or did not take part within ``timeout``.
        """

    @abstractmethod
    def broadcast(self, message: Any, src: int) -> Any:
        """Rank ``src``'s ``message`` on every rank (other ranks' ``message`` is ignored).

        Raises:
            CheckpointError: as :meth:`all_gather`.
        """

    def gather(self, message: Any, dst: int) -> list[Any] | None:
        """Every rank's ``message`` on rank ``dst`` (indexed by rank); None on the others.

        Raises:
            CheckpointError: as :meth:`all_gather`.
        """
        gathered = self.all_gather(message)
        return gathered if self.rank == dst else None

    def scatter(self, messages: list[Any] | None, src: int) -> Any:
        """``messages[rank]`` of rank ``src`` on each rank (``messages`` is read on ``src`` only).

        Raises:
            CheckpointError: as :meth:`all_gather`.
        """
        return self.broadcast(messages, src)[self.rank]


class LocalCollective(Collective):
    """The group of one process: what a program without torch.distributed uses."""

    @property
    def rank(self) -> int:
        # docstring inherited
        return 0

    @property
    def world_size(self) -> int:
        # docstring inherited
        return 1

    def all_gather(self, message: Any) -> list[Any]:
        # docstring inherited
        return [decode(encode(message))]

    def broadcast(self, message: Any, src: int) -> Any:
        # docstring inherited
        return decode(encode(message))


class ThreadGroup:
    """A group whose ranks are threads of one process: the test double of a process group.

    Each thread takes its rank's :class:`Collective` from :meth:`collective`. :meth:`abort`
    makes every pending and future exchange fail, as a rank dying does in a real group.

    Example::

        group = ThreadGroup(4)
        threads = [threading.Thread(target=work, args=(group.collective(r),)) for r in range(4)]
    """

    def __init__(self, world_size: int, *, timeout: float = 30.0) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self._barrier = threading.Barrier(world_size, timeout=timeout)
        self._slots: list[bytes] = [b""] * world_size

    def collective(self, rank: int) -> Collective:
        """The collective of ``rank``, to be used by one thread."""
        return _ThreadCollective(self, rank)

    def abort(self) -> None:
        """Break the group: every rank's current and later exchanges raise."""
        self._barrier.abort()

    def _wait(self, rank: int) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise CollectiveError(
                f"rank {rank}: exchanging messages with the other ranks failed (the group was "
                f"aborted, or a rank did not take part within {self.timeout:.0f} s)"
            ) from exc

    def exchange(self, rank: int, data: bytes | None, src: int | None) -> list[bytes]:
        if data is not None:
            self._slots[rank] = data
        self._wait(rank)
        result = list(self._slots) if src is None else [self._slots[src]]
        self._wait(rank)  # nobody overwrites a slot before everyone has read it
        return result


class _ThreadCollective(Collective):
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group = group
        self._rank = rank
        self.timeout = group.timeout

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def all_gather(self, message: Any) -> list[Any]:
        return [decode(d) for d in self._group.exchange(self._rank, encode(message), None)]

    def broadcast(self, message: Any, src: int) -> Any:
        data = encode(message) if self._rank == src else None
        return decode(self._group.exchange(self._rank, data, src)[0])
