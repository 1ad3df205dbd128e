"""Regressions the structured fuzzer (``fuzzer.py``) found in JSON plain values (issue 27
finding 7): hostile JSON is a DataLossError and the restore changes nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.tracking.state_json import MAX_DEPTH, JsonState, dumps, loads

HOSTILE = {
    "100,000 levels deep": b"[" * 100_000 + b"]" * 100_000,
    "100,000 levels of objects": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "a 100,000-digit integer": b'{"epoch": ' + b"9" * 100_000 + b"}",
    "deeper than MAX_DEPTH": b'{"epoch": ' + b"[" * (MAX_DEPTH + 2) + b"]" * (MAX_DEPTH + 2)
    + b"}",
    "a tuple tag with a number": b'{"epoch": {"__tuple__": 5}}',
    "a dict tag with a short pair": b'{"epoch": {"__dict__": [[1]]}}',
    "a dict tag with an unhashable key": b'{"epoch": {"__dict__": [[{"a": 1}, 2]]}}',
    "bytes tag that is not base64": b'{"epoch": {"__bytes__": "!!!"}}',
    "bytes tag with a number": b'{"epoch": {"__bytes__": 7}}',
    "float tag with a list": b'{"epoch": {"__float__": [1]}}',
    "an array of 2**40 elements": b'{"epoch": {"__ndarray__": {"dtype": "<f4", '
    b'"shape": [1099511627776], "data": ""}}}',
    "not UTF-8": b"\xff\xfe",
}


def _rewrite(prefix: str, key: str, value: bytes) -> None:
    with BundleReader(prefix) as reader:
        values = {k: np.array(reader.read(k), copy=True) for k in reader.keys()}
    values[key] = np.array(value, dtype=object)
    directory, base = os.path.split(prefix)
    for name in os.listdir(directory):
        if name.startswith(base + "."):
            os.remove(os.path.join(directory, name))
    with BundleWriter(prefix) as writer:
        for k, v in values.items():
            writer.add(k, v)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_plain_values_are_data_loss_and_change_nothing(tmp_path, name):
    saved = {"epoch": 3, "tags": ["a"], "w": tp.Variable(np.ones(2))}
    prefix = tp.Checkpoint(state=saved).write(str(tmp_path / "ckpt"))
    _rewrite(prefix, "state/.ATTRIBUTES/py_state", HOSTILE[name])
    live = {"epoch": 0, "tags": [], "w": tp.Variable(np.zeros(2))}
    with pytest.raises(DataLossError, match="state"):
        tp.Checkpoint(state=live).restore(prefix)
    assert live["epoch"] == 0 and list(live["tags"]) == []
    assert live["w"].numpy().tolist() == [0.0, 0.0]


def test_hostile_json_state_is_data_loss_and_changes_nothing(tmp_path):
    prefix = tp.Checkpoint(js=JsonState(step=7)).write(str(tmp_path / "ckpt"))
    _rewrite(prefix, "js/.ATTRIBUTES/py_state", HOSTILE["100,000 levels deep"])
    live = JsonState(step=0)
    with pytest.raises(DataLossError):
        tp.Checkpoint(js=live).restore(prefix)
    assert live == {"step": 0}


def test_torch_optimizer_state_with_hostile_json_changes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    prefix = tp.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    _rewrite(prefix, "optimizer/param_groups/.ATTRIBUTES/py_state",
             HOSTILE["a 100,000-digit integer"])
    fresh = torch.nn.Linear(2, 1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(DataLossError):
        tp.Checkpoint(model=fresh, optimizer=fresh_opt).restore(prefix)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))
    assert fresh_opt.param_groups[0]["lr"] == 0.1


def test_nesting_at_the_limit_round_trips_and_deeper_is_refused_on_save():
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert loads(dumps(deep, what="x"), what="x") == deep
    with pytest.raises(InvalidArgumentError, match="nested more than"):
        dumps([deep], what="x")
