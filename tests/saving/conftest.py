"""Fixtures for saving tests: shardable tensors and a minimal trackable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trackpoint.saving import ShardableTensor


class Holder:
    """A stand-in trackable: records every ``_restore_from_tensors`` call (copies the arrays)."""

    def __init__(self, name: str = "holder") -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []

    def _restore_from_tensors(self, tensors: dict[str, Any]) -> None:
        copied: dict[str, Any] = {}
        for name, value in tensors.items():
            if isinstance(value, dict):
                copied[name] = {spec: np.array(v, copy=True) for spec, v in value.items()}
            else:
                copied[name] = np.array(value, copy=True)
        self.calls.append(copied)

    def __repr__(self) -> str:
        return f"Holder({self.name!r})"


def shardable(
    key: str, array: Any, spec: str = "", device: str | None = None
) -> ShardableTensor:
    array = np.asarray(array) if not isinstance(array, np.ndarray) else array
    return ShardableTensor(
        tensor=array,
        dtype=array.dtype,
        device=device,
        name=key,
        shape=tuple(array.shape),
        slice_spec=spec,
        checkpoint_key=key,
        trackable=None,
    )


@pytest.fixture
def make_st() -> Callable[..., ShardableTensor]:
    return shardable


@pytest.fixture
def prefix(tmp_path) -> str:  # noqa: ANN001
    return str(tmp_path / "ckpt")


@pytest.fixture
def make_holder() -> Callable[[str], Holder]:
    return Holder
