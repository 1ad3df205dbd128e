"""The `checkpoint` state file (semantics D3, D6; tf-checkpoint-format.md §10)."""

from __future__ import annotations

import os

import pytest

from trackpoint.errors import InvalidArgumentError
from trackpoint.management.state_file import (
    get_checkpoint_mtimes,
    get_checkpoint_state,
    latest_checkpoint,
    remove_checkpoint,
    write_checkpoint_state,
)


def _touch_checkpoint(prefix: str, shards: int = 1) -> None:
    open(prefix + ".index", "wb").close()
    for i in range(shards):
        open(f"{prefix}.data-{i:05d}-of-{shards:05d}", "wb").close()


def test_text_layout_matches_tensorflow(tmp_path):
    d = str(tmp_path)
    write_checkpoint_state(
        d,
        os.path.join(d, "ckpt-3"),
        [os.path.join(d, "ckpt-2"), os.path.join(d, "ckpt-3")],
        [1795327014.5519116, 1795327014.5724077],
        1795327013.4520557,
    )
    assert (tmp_path / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-3"\n'
        'all_model_checkpoint_paths: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-3"\n'
        "all_model_checkpoint_timestamps: 1795327014.5519116\n"
        "all_model_checkpoint_timestamps: 1795327014.5724077\n"
        "last_preserved_timestamp: 1795327013.4520557\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]  # no temp file left behind


def test_plain_save_layout(tmp_path):
    write_checkpoint_state(tmp_path, str(tmp_path / "ckpt-1"))
    assert (tmp_path / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "ckpt-1"\n'
    )


def test_d3_relative_stored_absolute_returned(tmp_path):
    prefix = str(tmp_path / "ckpt-1")
    _touch_checkpoint(prefix)
    write_checkpoint_state(tmp_path, prefix)
    state = get_checkpoint_state(tmp_path)
    assert state.model_checkpoint_path == prefix
    assert list(state.all_model_checkpoint_paths) == [prefix]
    assert latest_checkpoint(tmp_path) == prefix


def test_d6_dot_relative_entries_resolved(tmp_path):
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "./model.ckpt-2"\nall_model_checkpoint_paths: "./model.ckpt-2"\n'
    )
    _touch_checkpoint(str(tmp_path / "model.ckpt-2"))
    assert os.path.normpath(latest_checkpoint(tmp_path)) == str(tmp_path / "model.ckpt-2")


def test_d6_empty_state_file_is_an_error(tmp_path):
    (tmp_path / "checkpoint").write_text("")
    with pytest.raises(ValueError, match="Invalid checkpoint state"):
        get_checkpoint_state(tmp_path)
    assert latest_checkpoint(tmp_path) is None


def test_d6_garbage_state_file_is_ignored(tmp_path, caplog):
    (tmp_path / "checkpoint").write_text("this is { not a proto")
    assert get_checkpoint_state(tmp_path) is None
    assert "unreadable checkpoint state" in caplog.text


def test_d6_prefix_colliding_with_state_file_rejected(tmp_path):
    with pytest.raises(InvalidArgumentError, match="collides with"):
        write_checkpoint_state(tmp_path, str(tmp_path / "checkpoint"))


def test_latest_checkpoint_ignores_uncommitted(tmp_path, caplog):
    write_checkpoint_state(tmp_path, str(tmp_path / "ckpt-9"))
    assert latest_checkpoint(tmp_path) is None
    assert "ckpt-9.index does not exist" in caplog.text


def test_missing_directory(tmp_path):
    assert get_checkpoint_state(tmp_path / "nope") is None
    assert latest_checkpoint(tmp_path / "nope") is None


def test_d6_mtimes_and_remove(tmp_path):
    prefixes = []
    for i in range(3):
        prefix = str(tmp_path / f"ckpt-{i}")
        _touch_checkpoint(prefix, shards=2)
        prefixes.append(prefix)
    (tmp_path / "ckpt-1.data-0000-of-00002").write_bytes(b"")  # not a 5-digit shard name
    mtimes = get_checkpoint_mtimes(prefixes)
    assert len(mtimes) == 3
    assert mtimes == sorted(mtimes)
    remove_checkpoint(prefixes[1])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "ckpt-1.index" not in names
    assert "ckpt-1.data-00000-of-00002" not in names
    assert "ckpt-1.data-0000-of-00002" in names
    assert "ckpt-0.index" in names and "ckpt-2.data-00001-of-00002" in names
    assert len(get_checkpoint_mtimes(prefixes)) == 2
