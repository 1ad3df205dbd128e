"""Device-to-host copies for lazy snapshots: pinned reused buffers, a side stream, events.

The GPU half of ``CheckpointOptions(enable_async=True, lazy_snapshot=True)``
(:mod:`trackpoint.integrations.torch_lazy`). For a tensor on a CUDA device the copy to host
memory is *issued* at the save call and runs on the device while training goes on:

1. an event is recorded on the stream that produced the value (the current stream at the call),
   and a side stream waits for it, so the copy reads exactly the value at the call;
2. the side stream copies the tensor, ``non_blocking``, into a page-locked (pinned) host buffer
   kept from the previous save of the same value (allocating pinned memory costs far more than
   the copy), then records a *done* event;
3. the optimizer's next ``step()`` (its step pre-hook) makes the current stream wait for the
   done event, :meth:`DeviceCopy.order_before_step`: the wait is on the device, the host never
   blocks, and the optimizer's kernels run only after the copy has read the value;
4. the writer thread synchronizes on the done event (:meth:`DeviceCopy.result`) and writes the
   buffer as it is: no second copy.

An in-place change issued on the current stream after the call but outside a gated optimizer
(EMA, ``p.mul_()``) is not ordered after the copy; it moves the tensor's version counter, which
:meth:`DeviceCopy.result` checks (the save then fails, as for CPU tensors).

The same logic runs on CPU tensors through :class:`CpuStreams`, whose copies are queued and
run when their event is waited for (as a device would run them later): tests check buffer
reuse and ordering without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from trackpoint.errors import FailedPreconditionError
from trackpoint.integrations.torch_tensors import to_numpy

__all__ = ["CpuStreams", "CudaStreams", "DeviceCopier", "DeviceCopy", "Streams"]


class Streams(Protocol):
    """Where copies run and how they are ordered (CUDA streams and events, or a CPU model)."""

    def record(self) -> Any:
        """An event on the current (producing) stream, at this point of its work."""

    def copy_after(self, event: Any, target: torch.Tensor, source: torch.Tensor) -> Any:
        """On the side stream, after ``event``: ``target.copy_(source)``; its done event."""

    def wait_on_device(self, done: Any) -> None:
        """The current stream's later work waits for ``done`` (the host does not block)."""

    def synchronize(self, done: Any) -> None:
        """Block the calling thread until ``done`` (the copy is in host memory)."""

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        """A host buffer for ``like``'s value (page-locked where that makes copies async)."""


class CudaStreams:
    """CUDA: one side stream per device, events for ordering, pinned host buffers."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._side = torch.cuda.Stream(device=device)

    def record(self) -> Any:
        # docstring inherited
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def copy_after(self, event: Any, target: torch.Tensor, source: torch.Tensor) -> Any:
        # docstring inherited
        done = torch.cuda.Event()
        with torch.cuda.stream(self._side):
            self._side.wait_event(event)
            target.copy_(source.detach(), non_blocking=True)
            # The caching allocator must not reuse ``source``'s memory before the copy ran.
            source.record_stream(self._side)
            done.record(self._side)
        return done

    def wait_on_device(self, done: Any) -> None:
        # docstring inherited
        torch.cuda.current_stream(self._device).wait_event(done)

    def synchronize(self, done: Any) -> None:
        # docstring inherited
        done.synchronize()

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        # docstring inherited
        return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=True)


class _CpuEvent:
    """A point in :class:`CpuStreams`' queue: the copies before it run when it is waited for."""

    def __init__(self, work: list[Callable[[], object]]) -> None:
        self._work = work
        self._lock = threading.Lock()

    def run(self) -> None:
        with self._lock:
            work, self._work = self._work, []
        for step in work:
            step()


class CpuStreams:
    """The same protocol for CPU tensors: a copy runs when its done event is first waited for.

    A model of a device that runs copies later than they are issued, so the ordering the
    gates rely on is exercised by tests on any machine. Not used for real CPU saves (those
    defer the copy itself, :mod:`trackpoint.saving.lazy_snapshot`).
    """

    def record(self) -> Any:
        # docstring inherited
        return None  # CPU work issued before the call has already run

    def copy_after(self, event: Any, target: torch.Tensor, source: torch.Tensor) -> Any:
        # docstring inherited
        return _CpuEvent([lambda: target.copy_(source.detach())])

    def wait_on_device(self, done: Any) -> None:
        # docstring inherited
        done.run()

    def synchronize(self, done: Any) -> None:
        # docstring inherited
        done.run()

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        # docstring inherited
        return torch.empty(like.shape, dtype=like.dtype, device="cpu")


class DeviceCopy:
    """One value's copy to host memory, issued at the call (see the module docstring)."""

    def __init__(
        self, streams: Streams, tensor: torch.Tensor, buffer: torch.Tensor, what: str
    ) -> None:
        self._streams = streams
        self._tensor = tensor
        self._what = what
        self._version = int(tensor._version)
        self._ordered = False  # a gate ordered the optimizer's changes after the copy
        self.buffer = buffer
        self._done = streams.copy_after(streams.record(), buffer, tensor)

    def order_before_step(self) -> None:
        """Before the optimizer changes the value: its work waits for the copy (on device).

        A change made between the call and here (not through the gated optimizer) is seen by
        the version counter; :meth:`result` then fails.
        """
        if int(self._tensor._version) == self._version:
            self._ordered = True
        self._streams.wait_on_device(self._done)

    def result(self) -> np.ndarray:
        """On the writer thread: wait for the copy; the buffer's value as an array.

        Raises:
            FailedPreconditionError: the value was changed after the call by something no gate
                ordered after the copy (the copy may have read the change).
        """
        self._streams.synchronize(self._done)
        if not self._ordered and int(self._tensor._version) != self._version:
            raise FailedPreconditionError(
                f"lazy snapshot of {self._what} failed: the device tensor changed after save() "
                f"returned and before its copy to host memory was done (version {self._version}"
                f" at the call, {int(self._tensor._version)} now), and not through a tracked "
                "optimizer's step(). This checkpoint is not written. Track the optimizer, call "
                "sync() before changing the tensor, or save without lazy_snapshot"
            )
        return to_numpy(self.buffer, what=self._what)


class DeviceCopier:
    """Issues :class:`DeviceCopy` s into host buffers kept per value from save to save.

    Args:
        streams: CUDA streams of the device, or :class:`CpuStreams`.
    """

    def __init__(self, streams: Streams) -> None:
        self._streams = streams
        self._buffers: dict[str, torch.Tensor] = {}

    def issue(self, key: str, tensor: torch.Tensor) -> DeviceCopy:
        """Start copying ``tensor`` (the value of ``key``) to its host buffer; returns at once.

        The buffer of ``key``'s previous copy is reused when shape and dtype still fit; the
        caller must be done with that previous copy (one lazy save at a time, as the async
        writer runs them).
        """
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self._buffers[key] = self._streams.pinned(tensor)
        return DeviceCopy(self._streams, tensor, buffer, key)
