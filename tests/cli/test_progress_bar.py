"""The CLI's byte progress bar: only for large work on a terminal, labelled by phase."""

from __future__ import annotations

import io
import threading

import numpy as np
from rich.console import Console

import trackpoint as tp
from trackpoint.cli.progress import LARGE_WORK_BYTES, ByteProgress, human_bytes
from trackpoint.saving import ProgressEvent


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100), out


def _event(phase: str, done: int, total: int) -> ProgressEvent:
    return ProgressEvent("/ckpt", phase, 0, 1, done, total)


def test_small_work_and_pipes_get_no_bar() -> None:
    console, out = _console(terminal=True)
    with ByteProgress(console, "saving") as bar:
        bar.update(10, LARGE_WORK_BYTES - 1)
    assert not bar.shown and out.getvalue() == ""
    console, out = _console(terminal=False)
    with ByteProgress(console, "saving") as bar:
        bar.update(10, LARGE_WORK_BYTES * 10)
    assert not bar.shown and out.getvalue() == ""


def test_large_work_on_a_terminal_shows_the_bar_until_closed() -> None:
    console, out = _console(terminal=True)
    with ByteProgress(console, "converting", threshold=1000) as bar:
        bar.update(500, 2000)
        bar.update(2000, 2000)
    assert bar.shown
    assert "converting" in out.getvalue()
    bar.update(1, 2000)  # ignored after close


def test_events_relabel_the_bar_per_phase() -> None:
    console, out = _console(terminal=True)
    with ByteProgress(console, "saving", threshold=100) as bar:
        bar.on_event(_event("stage", 1000, 1000))
        assert bar.label == "saving: staging"
        bar.on_event(_event("write", 200, 1000))
        assert bar.label == "saving: writing"
        bar.on_event(_event("commit", 1000, 1000))
        assert bar.label == "saving: writing"
    assert bar.shown and "saving: staging" in out.getvalue()


def test_events_from_another_thread() -> None:
    console, _ = _console(terminal=True)
    with ByteProgress(console, "saving", threshold=1) as bar:
        threads = [
            threading.Thread(target=lambda: [bar.on_event(_event("write", i, 100))
                                             for i in range(100)])
            for _ in range(4)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert bar.shown


def test_bar_follows_a_real_save_and_restore(tmp_path) -> None:  # noqa: ANN001
    console, out = _console(terminal=True)
    state = {"w": np.ones(4096, np.float32)}
    with ByteProgress(console, "checkpoint", threshold=1) as bar:
        options = tp.CheckpointOptions(progress=bar.on_event)
        path = tp.Checkpoint(model=state).write(tmp_path / "ckpt", options)
        assert bar.label == "checkpoint: writing"
        tp.Checkpoint(model={"w": np.zeros(4096, np.float32)}).read(path, options)
        assert bar.label == "checkpoint: reading"
    assert bar.shown and "checkpoint: writing" in out.getvalue()


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(5 << 20) == "5.0 MiB"
    assert human_bytes(3 << 40) == "3072.0 GiB"
