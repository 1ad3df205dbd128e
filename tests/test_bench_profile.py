"""bench/profile_small.py times the steps of the library by name: it must keep finding them."""

from __future__ import annotations

import re

import pytest

from bench.profile_small import main


def test_every_operation_is_timed_step_by_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--count", "300", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    for operation in ("save, one Checkpoint again", "restore, one Checkpoint again",
                      "save, a fresh Checkpoint", "restore, a fresh Checkpoint"):
        assert re.search(rf"^{operation}: \d+ ms", out, re.MULTILINE), operation
    # Steps that every save and every fresh restore passes through were timed.
    assert out.count("saver.save: shard, write, commit") == 2
    assert out.count("walk: bind nodes to objects, plan") == 1  # the repeated read replays
    assert out.count("replay the last read's walk") == 1
    assert out.count("Checkpoint(state=d): track the dict") == 2
