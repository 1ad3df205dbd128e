"""``TorchCollective``: the messages of a distributed save over a gloo group of torch.distributed.

The only collective that needs torch (see ``trackpoint.distributed.collective`` for the
contract); ``trackpoint.distributed`` imports it when torch is installed.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from trackpoint.distributed.collective import Collective, decode, encode
from trackpoint.errors import CollectiveError, FailedPreconditionError

__all__ = ["TorchCollective"]


def _padded(data: bytes, length: int) -> torch.Tensor:
    """``data`` in a uint8 tensor of ``length`` bytes (gloo exchanges equal-sized tensors)."""
    tensor = torch.zeros(length, dtype=torch.uint8)
    if data:
        tensor[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tensor


_FRAME = 1024
"""Bytes of a message's first exchange: an 8-byte length, then up to 1016 bytes of the message.

Most messages (errors, paths, shard counts) fit, so an exchange is one gloo round trip instead
of two (sizes, then data); each round trip waits for the slowest rank, which on a busy machine
costs more than the bytes. Longer messages send the rest in a second exchange.
"""
_INLINE = _FRAME - 8


def _frame(data: bytes) -> torch.Tensor:
    """The first exchange of ``data``: its length, then its first ``_INLINE`` bytes."""
    return _padded(len(data).to_bytes(8, "little") + data[:_INLINE], _FRAME)


def _frame_length(frame: torch.Tensor) -> int:
    return int.from_bytes(bytes(frame[:8].numpy()), "little")


class TorchCollective(Collective):
    """Messages over a gloo process group of ``torch.distributed``.

    Checkpoint traffic gets a group of its own, so that an async save's background exchanges
    never interleave with the program's collectives: a new gloo group over ``group``'s ranks is
    created, unless ``group`` already is a gloo group (then it is used as is, and must not be
    used by anything else while a save runs). Creating a group is itself collective: construct
    on every rank of ``group``, in the same order as other groups.

    Args:
        group: the ranks taking part; the default (world) group when None.
        timeout: seconds to wait for the other ranks in one exchange.

    Raises:
        FailedPreconditionError: torch.distributed is not initialized, or gloo is unavailable.
    """

    def __init__(self, group: Any = None, *, timeout: float = 1800.0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise FailedPreconditionError(
                "torch.distributed is not initialized: call torch.distributed.init_process_group "
                "first (torchrun sets the environment), or save without a group"
            )
        if not dist.is_gloo_available():
            raise FailedPreconditionError("trackpoint.distributed needs the gloo backend of torch")
        self.timeout = float(timeout)
        if group is not None and dist.get_backend(group) == "gloo":
            self._group = group
        else:
            ranks = None if group is None else dist.get_process_group_ranks(group)
            self._group = dist.new_group(
                ranks=ranks,
                backend="gloo",
                timeout=datetime.timedelta(seconds=self.timeout),
                use_local_synchronization=ranks is not None,
            )
        self._rank = dist.get_rank(self._group)
        self._world_size = dist.get_world_size(self._group)

    @property
    def group(self) -> Any:
        """The gloo process group carrying the messages."""
        return self._group

    @property
    def rank(self) -> int:
        # docstring inherited
        return self._rank

    @property
    def world_size(self) -> int:
        # docstring inherited
        return self._world_size

    def _failed(self, what: str, exc: BaseException) -> CollectiveError:
        return CollectiveError(
            f"rank {self._rank}: {what} with the other {self._world_size - 1} rank(s) failed "
            f"({type(exc).__name__}: {exc}). A rank died, raised outside trackpoint, or did not "
            f"reach the same call within {self.timeout:.0f} s; check the other ranks' logs"
        )

    def all_gather(self, message: Any) -> list[Any]:
        # docstring inherited
        data = encode(message)
        try:
            frames = [torch.empty(_FRAME, dtype=torch.uint8) for _ in range(self._world_size)]
            dist.all_gather(frames, _frame(data), group=self._group)
            sizes = [_frame_length(f) for f in frames]
            rest = max(sizes) - _INLINE
            tails = None
            if rest > 0:  # a long message: everyone sends the rest of theirs, padded alike
                tails = [torch.empty(rest, dtype=torch.uint8) for _ in sizes]
                dist.all_gather(tails, _padded(data[_INLINE:], rest), group=self._group)
        except (RuntimeError, ValueError) as exc:  # gloo: DistBackendError, timeouts
            raise self._failed("exchanging messages", exc) from exc
        out = []
        for i, (frame, size) in enumerate(zip(frames, sizes)):
            raw = bytes(frame[8 : 8 + min(size, _INLINE)].numpy())
            if tails is not None and size > _INLINE:
                raw += bytes(tails[i][: size - _INLINE].numpy())
            out.append(decode(raw))
        return out

    def _sizes(self, data: bytes) -> list[int]:
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self._world_size)]
        dist.all_gather(sizes, size, group=self._group)
        return [int(s.item()) for s in sizes]

    def gather(self, message: Any, dst: int) -> list[Any] | None:
        # docstring inherited
        data = encode(message)
        try:
            sizes = self._sizes(data)
            padded = _padded(data, max(sizes))
            out = None
            if self._rank == dst:
                out = [torch.empty(max(sizes), dtype=torch.uint8) for _ in sizes]
            dist.gather(padded, out, dst=dist.get_global_rank(self._group, dst), group=self._group)
        except (RuntimeError, ValueError) as exc:
            raise self._failed(f"sending messages to rank {dst}", exc) from exc
        if out is None:
            return None
        return [decode(bytes(t[:n].numpy())) for t, n in zip(out, sizes)]

    def scatter(self, messages: list[Any] | None, src: int) -> Any:
        # docstring inherited
        encoded = [encode(m) for m in messages] if self._rank == src and messages else []
        try:
            sizes = torch.tensor([len(d) for d in encoded] or [0] * self._world_size)
            dist.broadcast(sizes, src=dist.get_global_rank(self._group, src), group=self._group)
            longest = int(sizes.max().item())
            chunks = [_padded(d, longest) for d in encoded] if self._rank == src else None
            out = torch.empty(longest, dtype=torch.uint8)
            dist.scatter(out, chunks, src=dist.get_global_rank(self._group, src),
                         group=self._group)
        except (RuntimeError, ValueError) as exc:
            raise self._failed(f"receiving rank {src}'s messages", exc) from exc
        return decode(bytes(out[: int(sizes[self._rank].item())].numpy()))

    def broadcast(self, message: Any, src: int) -> Any:
        # docstring inherited
        data = encode(message) if self._rank == src else b""
        source = dist.get_global_rank(self._group, src)
        try:
            frame = _frame(data)
            dist.broadcast(frame, src=source, group=self._group)
            size = _frame_length(frame)
            raw = bytes(frame[8 : 8 + min(size, _INLINE)].numpy())
            if size > _INLINE:  # a long message: the rest in a second exchange
                tail = _padded(data[_INLINE:], size - _INLINE)
                dist.broadcast(tail, src=source, group=self._group)
                raw += bytes(tail.numpy())
        except (RuntimeError, ValueError) as exc:
            raise self._failed(f"receiving rank {src}'s message", exc) from exc
        return decode(raw)
