"""Value scenarios of semantics.md parameterised over numpy and PyTorch holders (§4 "Values").

A1 (nested tree round trip), B3 (restore in place, twice), B8 (shape and dtype mismatch leave
the holder unchanged) and B1 (values for a holder attached after the restore).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable


@dataclass(frozen=True)
class Backend:
    name: str
    make: Callable[[np.ndarray], Any]
    to_numpy: Callable[[Any], np.ndarray]
    fill: Callable[[Any, float], None]


def _numpy_fill(array: np.ndarray, value: float) -> None:
    array[...] = value


def _torch_backend() -> Backend:
    torch = pytest.importorskip("torch")

    def fill(tensor: Any, value: float) -> None:
        with torch.no_grad():
            tensor.fill_(value)

    return Backend("torch", lambda a: torch.from_numpy(np.array(a)),
                   lambda t: t.detach().numpy(), fill)


@pytest.fixture(params=["numpy", "torch"])
def backend(request) -> Backend:
    if request.param == "numpy":
        return Backend("numpy", lambda a: np.array(a), lambda a: a, _numpy_fill)
    return _torch_backend()


def _tree(backend: Backend, seed: float) -> tuple[AutoTrackable, dict[str, Any]]:
    leaves = {
        "w": backend.make(np.full((2, 3), seed, dtype=np.float32)),
        "step": backend.make(np.array(int(seed), dtype=np.int64)),
        "flag": backend.make(np.array(seed > 1)),
        "empty": backend.make(np.zeros((0, 4), dtype=np.float64)),
        "half": backend.make(np.full(3, seed, dtype=np.float16)),
        "c": backend.make(np.array([seed + 1j], dtype=np.complex64)),
        "u16": backend.make(np.arange(4, dtype=np.uint16) + int(seed)),
    }
    root = AutoTrackable()
    root.child = AutoTrackable()
    root.child.w = leaves["w"]
    root.child.step = leaves["step"]
    root.items = [leaves["flag"], leaves["empty"]]
    root.table = {"half": leaves["half"], "c": leaves["c"], "u16": leaves["u16"]}
    return root, leaves


def test_a1_nested_tree_round_trips(tmp_path, backend):
    saved_root, saved = _tree(backend, 3.0)
    expected = {k: backend.to_numpy(v).copy() for k, v in saved.items()}
    path = Checkpoint(model=saved_root).save(tmp_path / "ckpt")
    fresh_root, fresh = _tree(backend, 0.0)
    Checkpoint(model=fresh_root).restore(path).assert_consumed()
    for name, want in expected.items():
        got = backend.to_numpy(fresh[name])
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_b3_restore_in_place_twice(tmp_path, backend):
    root, leaves = _tree(backend, 2.0)
    expected = {k: backend.to_numpy(v).copy() for k, v in leaves.items()}
    ids = {k: id(v) for k, v in leaves.items()}
    ckpt = Checkpoint(model=root)
    path = ckpt.write(tmp_path / "ckpt")
    for _ in range(2):
        for name in ("w", "half", "u16"):
            backend.fill(leaves[name], 9)
        ckpt.read(path).assert_consumed()
        for name, want in expected.items():
            assert id(leaves[name]) == ids[name]
            np.testing.assert_array_equal(backend.to_numpy(leaves[name]), want, err_msg=name)
    assert root.child.w is leaves["w"]


def test_b8_shape_mismatch(tmp_path, backend):
    path = Checkpoint(v=backend.make(np.ones(2, dtype=np.float32))).write(tmp_path / "ckpt")
    holder = backend.make(np.zeros(1, dtype=np.float32))
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        Checkpoint(v=holder).read(path)
    np.testing.assert_array_equal(backend.to_numpy(holder), [0.0])


def test_b8_dtype_mismatch(tmp_path, backend):
    path = Checkpoint(v=backend.make(np.ones(2, dtype=np.float64))).write(tmp_path / "ckpt")
    holder = backend.make(np.zeros(2, dtype=np.int32))
    with pytest.raises(InvalidArgumentError, match="dtype"):
        Checkpoint(v=holder).read(path)
    np.testing.assert_array_equal(backend.to_numpy(holder), [0, 0])


def test_b1_holder_attached_after_restore(tmp_path, backend):
    path = Checkpoint(v=backend.make(np.arange(3, dtype=np.float32))).write(tmp_path / "ckpt")
    ckpt = Checkpoint()
    status = ckpt.read(path)
    status.assert_existing_objects_matched()
    holder = backend.make(np.zeros(3, dtype=np.float32))
    ckpt.v = holder
    np.testing.assert_array_equal(backend.to_numpy(holder), [0.0, 1.0, 2.0])
    status.assert_consumed()


def test_python_numbers_survive_in_a_json_state(tmp_path):
    from trackpoint.tracking.state_json import JsonState

    progress = JsonState(epoch=3, best=float("inf"), history=[0.5, 0.25], name="run")
    path = Checkpoint(progress=progress).write(tmp_path / "ckpt")
    fresh = JsonState(epoch=0)
    Checkpoint(progress=fresh).read(path).assert_consumed()
    assert fresh == {"epoch": 3, "best": float("inf"), "history": [0.5, 0.25], "name": "run"}
    fresh["epoch"] += 1
    assert fresh["epoch"] == 4
