"""Saves and restores pause the cyclic garbage collector, and always give it back."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import trackpoint as tp
from trackpoint._gc import collector_paused


@pytest.fixture(autouse=True)
def _collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    gc.enable() if was else gc.disable()


def _fail_paused() -> None:
    with collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")


def test_paused_inside_and_enabled_after_even_on_error():
    with pytest.raises(RuntimeError, match="boom"):
        _fail_paused()
    assert gc.isenabled()


def test_nested_pauses_enable_once_the_outer_ends():
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_program_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_on_two_threads():
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause is still running
    release.set()
    thread.join()
    assert gc.isenabled()


class _Probe(tp.Trackable):
    """Records whether the collector ran while trackpoint called it."""

    def __init__(self) -> None:
        self.value = np.zeros(3)
        self.seen: list[bool] = []

    def _serialize_to_tensors(self):  # noqa: ANN202
        self.seen.append(gc.isenabled())
        return {"value": self.value}

    def _restore_from_tensors(self, restored_tensors):  # noqa: ANN001, ANN202
        self.seen.append(gc.isenabled())
        self.value[...] = restored_tensors["value"]


def test_checkpoint_write_and_read_run_paused(tmp_path):
    probe = _Probe()
    probe.value[...] = 5
    ckpt = tp.Checkpoint(probe=probe)
    path = ckpt.write(str(tmp_path / "ckpt"))
    assert gc.isenabled()
    fresh = _Probe()
    tp.Checkpoint(probe=fresh).read(path).assert_consumed()
    assert gc.isenabled()
    assert np.array_equal(fresh.value, [5, 5, 5])
    assert probe.seen and not any(probe.seen)
    assert fresh.seen and not any(fresh.seen)
