"""The batch-first protocol's defaults and the rule that keeps subclass overrides honoured."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import Trackable, batch_hook


class _Box(Trackable):
    def __init__(self, value: float) -> None:
        self.value = np.array(value)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"v": self.value}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        saved = restored_tensors["v"]
        if saved.shape != ():
            raise InvalidArgumentError(f"shape {saved.shape}")
        return lambda: self.value.__setitem__((), saved)


class _BatchBox(_Box):
    _whole_value_names = ("v",)
    calls: list[int] = []

    @classmethod
    def _prepare_restores(
        cls, trackables: Any, restored: Any, on_error: Any
    ) -> Callable[[], None]:
        cls.calls.append(len(trackables))
        return super()._prepare_restores(trackables, restored, on_error)


class _StricterBox(_BatchBox):
    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        raise InvalidArgumentError("never fits")


def test_the_default_batch_checks_every_value_before_applying_any() -> None:
    boxes = [_Box(1.0), _Box(2.0)]
    restores = batch_hook(_Box, "_prepare_restores")
    with pytest.raises(KeyError, match="1"):
        restores(boxes, [{"v": np.array(5.0)}, {"v": np.zeros(3)}],
                 lambda index, exc: KeyError(index))  # fmt: skip
    assert [float(box.value) for box in boxes] == [1.0, 2.0]
    apply = restores(boxes, [{"v": np.array(5.0)}, {"v": np.array(6.0)}], None)
    assert [float(box.value) for box in boxes] == [1.0, 2.0]
    apply()
    assert [float(box.value) for box in boxes] == [5.0, 6.0]
    assert batch_hook(_Box, "_serialize_many")(boxes)[1]["v"] is boxes[1].value


def test_a_class_batch_form_serves_its_class_and_not_a_subclass_that_checks_more() -> None:
    assert batch_hook(_BatchBox, "_whole_value_names") == ("v",)
    batch_hook(_BatchBox, "_prepare_restores")([_BatchBox(1.0)], [{"v": np.array(2.0)}], None)
    assert _BatchBox.calls == [1]
    # _StricterBox overrides the per-object check below the batch form: the default serves it.
    assert batch_hook(_StricterBox, "_whole_value_names") is None
    with pytest.raises(ValueError, match="never fits"):
        batch_hook(_StricterBox, "_prepare_restores")(
            [_StricterBox(1.0)], [{"v": np.array(2.0)}], lambda index, exc: ValueError(str(exc))
        )
    assert _BatchBox.calls == [1]
    assert batch_hook(Trackable, "_whole_value_names") is None


def test_batch_hook_keeps_no_class_alive_and_sees_a_batch_form_added_later() -> None:
    # A program (or a test suite) that makes classes and drops them must not leak them through
    # the hook, and a batch form patched onto a class after its first save takes effect.
    import gc
    import weakref

    made = type("Made", (_Box,), {})
    assert batch_hook(made, "_whole_value_names") is None
    ref = weakref.ref(made)
    del made
    gc.collect()
    assert ref() is None

    later = type("Later", (_Box,), {})
    assert batch_hook(later, "_whole_value_names") is None
    later._whole_value_names = ("v",)
    assert batch_hook(later, "_whole_value_names") == ("v",)
