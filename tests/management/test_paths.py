"""The one path resolver, seen through ``tp.load_checkpoint`` and ``Checkpoint.restore`` (D5).

Every form a user may pass names the same checkpoint in both; a missing checkpoint is a
``NotFoundError`` with the ``-N`` hint; a torch or safetensors file says what it is and names
``trackpoint convert``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError, NotFoundError

KEY = "w/.ATTRIBUTES/VARIABLE_VALUE"


def _load(path: str) -> float:
    with tp.load_checkpoint(path) as reader:
        return float(reader.get_tensor(KEY)[0])


def _restore(path: str) -> float:
    w = np.zeros(1)
    tp.Checkpoint(w=w).restore(path).expect_partial()
    return float(w[0])


BOTH = pytest.mark.parametrize("open_", [_load, _restore], ids=["load_checkpoint", "restore"])


@pytest.fixture
def saved(tmp_path) -> str:
    """A directory with two saves; the state file names the second, ``ckpt-2`` (w = 2)."""
    w = np.ones(1)
    ckpt = tp.Checkpoint(w=w)
    ckpt.save(str(tmp_path / "ckpt"))
    w[0] = 2.0
    return ckpt.save(str(tmp_path / "ckpt"))


@BOTH
@pytest.mark.parametrize(
    "form",
    [lambda p: p, lambda p: p + ".index", lambda p: p + ".data-00000-of-00001",
     lambda p: os.path.dirname(p)],
    ids=["prefix", "index", "data", "directory"],
)  # fmt: skip
def test_d5_every_form_names_the_checkpoint(
    saved: str, open_: Callable[[str], float], form: Callable[[str], str]
) -> None:
    assert open_(form(saved)) == 2.0


@BOTH
def test_d5_an_older_prefix_is_its_own_checkpoint(saved: str, open_) -> None:
    assert open_(saved[: -len("2")] + "1") == 1.0


@BOTH
def test_d5_missing_checkpoint_is_not_found(saved: str, open_) -> None:
    missing = saved[: -len("-2")]  # the prefix given to save(), without its number
    with pytest.raises(NotFoundError, match="Failed to find any matching files") as raised:
        open_(missing)
    assert isinstance(raised.value, FileNotFoundError) and "-1" in str(raised.value)
    with pytest.raises(NotFoundError):
        open_(saved + "-9")


@BOTH
def test_d5_directory_without_checkpoint_is_not_found(tmp_path, open_) -> None:
    with pytest.raises(NotFoundError, match="without a committed checkpoint"):
        open_(str(tmp_path))


@BOTH
@pytest.mark.parametrize(
    ("name", "what"),
    [("model.pt", "a PyTorch file"), ("model.pth", "a PyTorch file"),
     ("model.safetensors", "a safetensors file")],
)  # fmt: skip
def test_foreign_files_name_their_format_and_the_converter(
    tmp_path, open_, name: str, what: str
) -> None:
    path = tmp_path / name
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(InvalidArgumentError, match=f"is {what}, not a TensorFlow checkpoint") as e:
        open_(str(path))
    assert "trackpoint convert" in str(e.value)
