"""A rich progress bar for the ``trackpoint`` command that appears only when it helps.

Long saves, restores, conversions and verifications show bytes done, rate and time left; short
ones (below ``LARGE_WORK_BYTES``) and runs without a terminal (pipes, CI logs) show nothing, so
the output stays clean. The bar is fed either with ``(done, total)`` byte counts or with the
``ProgressEvent`` s of ``CheckpointOptions.progress``.
"""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from trackpoint.saving import ProgressEvent

__all__ = ["LARGE_WORK_BYTES", "ByteProgress", "human_bytes"]

LARGE_WORK_BYTES = 64 << 20
"""Work smaller than this finishes too fast for a bar to be useful."""


def human_bytes(n: int) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"1.5 KiB"`` … ``"3.2 GiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


# What the bar says during each ProgressEvent phase; the closing phases keep the label.
_PHASE_LABELS = {
    "stage": "staging",
    "write": "writing",
    "commit": "writing",
    "read": "reading",
    "restored": "reading",
}


class ByteProgress:
    """A transient byte-count bar, created on the first update that shows large work.

    Thread-safe: an async save reports from its writer thread. Use as a context manager; the
    bar disappears when the block ends. Fed with ``ProgressEvent`` s, the bar is labelled by
    phase and starts over when the phase changes (an async save stages, then writes).

    Args:
        console: where to draw; nothing is drawn unless it is a terminal.
        description: the label left of the bar, e.g. ``"converting"``.
        threshold: the smallest total, in bytes, that gets a bar.

    Example::

        with ByteProgress(console, "saving") as bar:
            ckpt.write(prefix, tp.CheckpointOptions(progress=bar.on_event))
    """

    def __init__(
        self, console: Console, description: str, *, threshold: int = LARGE_WORK_BYTES
    ) -> None:
        self._console = console
        self._description = description
        self._threshold = threshold
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._label = description
        self._closed = False
        self._shown = False

    @property
    def shown(self) -> bool:
        """True once the bar has been drawn (stays True after :meth:`close`)."""
        return self._shown

    def update(self, done: int, total: int, *, label: str | None = None) -> None:
        """Show ``done`` of ``total`` bytes (the bar appears once ``total`` is large).

        A ``label`` other than the current one restarts the bar under that label.
        """
        with self._lock:
            if self._closed:
                return
            label = label or self._label
            if self._progress is None:
                if total < self._threshold or not self._console.is_terminal:
                    self._label = label
                    return
                self._progress = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(),
                    console=self._console,
                    transient=True,
                )
                self._progress.start()
                self._shown = True
                self._task = self._progress.add_task(label, total=total)
            elif label != self._label:
                assert self._task is not None
                self._progress.reset(self._task, total=total, description=label)
            self._label = label
            assert self._task is not None
            self._progress.update(self._task, completed=done, total=total)

    @property
    def label(self) -> str:
        """What the bar says now (the description, or the current phase)."""
        return self._label

    def on_event(self, event: ProgressEvent) -> None:
        """A ``CheckpointOptions.progress`` callback: follows the bytes of the current phase."""
        label = _PHASE_LABELS.get(event.phase, event.phase)
        self.update(event.bytes_done, event.bytes_total, label=f"{self._description}: {label}")

    def close(self) -> None:
        """Remove the bar (if it was shown); later updates are ignored."""
        with self._lock:
            self._closed = True
            progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
