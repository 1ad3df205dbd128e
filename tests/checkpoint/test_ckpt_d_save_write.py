"""Scenarios D1–D5: save/write/read/restore, numbering, the state file, paths, missing files."""

from __future__ import annotations

import glob
import os
import pathlib

import pytest
from ckpt_helpers import keys_of, value_of

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import NotFoundError
from trackpoint.management.state_file import get_checkpoint_state, latest_checkpoint
from trackpoint.tracking import AutoTrackable, Variable

COUNTER = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"


def test_d1_save_numbers_and_counter(tmp_path):
    v = Variable(0.0)
    ckpt = Checkpoint(v=v)
    prefix = str(tmp_path / "ckpt")
    paths = [ckpt.save(prefix) for _ in range(3)]
    assert paths == [f"{prefix}-1", f"{prefix}-2", f"{prefix}-3"]
    assert int(value_of(paths[1], COUNTER)) == 2

    fresh = Checkpoint()
    status = fresh.restore(paths[1])
    assert int(fresh.save_counter.numpy()) == 2  # before any other leaf is attached
    fresh.v = Variable(0.0)
    status.assert_consumed()
    assert fresh.save(prefix) == f"{prefix}-3"


def test_d1_counter_exists_only_after_save_or_restore(tmp_path):
    ckpt = Checkpoint(v=Variable(1.0))
    assert COUNTER not in keys_of(ckpt.write(tmp_path / "w"))
    path = ckpt.save(tmp_path / "s")
    assert COUNTER in keys_of(path)
    restored = Checkpoint(v=Variable(0.0))
    restored.read(path)
    assert COUNTER not in keys_of(restored.write(tmp_path / "after-read"))
    restored.restore(path)
    assert COUNTER in keys_of(restored.write(tmp_path / "after-restore"))


def test_d2_write_is_exact_and_leaves_counter_and_state_alone(tmp_path):
    v = Variable(1.0)
    ckpt = Checkpoint(v=v)
    prefix = str(tmp_path / "exact")
    assert ckpt.write(prefix) == prefix
    assert not os.path.exists(tmp_path / "checkpoint")
    v.assign(2.0)
    assert ckpt.write(pathlib.Path(prefix)) == prefix  # overwrites
    assert float(value_of(prefix, "v/.ATTRIBUTES/VARIABLE_VALUE")) == 2.0
    assert sorted(os.listdir(tmp_path)) == ["exact.data-00000-of-00001", "exact.index"]
    fresh_v = Variable(0.0)
    Checkpoint(v=fresh_v).read(prefix).assert_consumed().assert_existing_objects_matched()
    assert fresh_v.numpy() == 2.0


def test_d2_restore_of_write_checkpoint_creates_counter_but_assertions_pass(tmp_path):
    prefix = Checkpoint(v=Variable(1.0)).write(tmp_path / "exact")
    ckpt = Checkpoint(v=Variable(0.0))
    status = ckpt.restore(prefix)
    assert int(ckpt.save_counter.numpy()) == 0  # created, nothing to restore it from
    status.assert_consumed().assert_existing_objects_matched()  # our choice: bookkeeping only


def test_d3_state_file_after_save(tmp_path):
    ckpt = Checkpoint(v=Variable(1.0))
    paths = [ckpt.save(tmp_path / "ckpt") for _ in range(10)]
    assert len(glob.glob(str(tmp_path / "*.index"))) == 10  # plain save deletes nothing
    assert latest_checkpoint(tmp_path) == paths[-1]
    state = get_checkpoint_state(tmp_path)
    assert list(state.all_model_checkpoint_paths) == [paths[-1]]
    text = (tmp_path / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-10"' in text  # stored relative


def test_d4_pathlike_prefixes_and_missing_parents(tmp_path):
    v = Variable(3.0)
    ckpt = Checkpoint(v=v)
    saved = ckpt.save(tmp_path / "a" / "b" / "ckpt")
    assert saved == str(tmp_path / "a" / "b" / "ckpt-1")
    written = ckpt.write(tmp_path / "c" / "d" / "exact")
    v.assign(0.0)
    ckpt.restore(pathlib.Path(saved)).assert_consumed()
    assert v.numpy() == 3.0
    v.assign(0.0)
    ckpt.read(pathlib.Path(written)).assert_consumed()
    assert v.numpy() == 3.0
    assert latest_checkpoint(tmp_path / "a" / "b") == saved


def test_d5_missing_prefix_is_not_found_with_suffix_hint(tmp_path):
    ckpt = Checkpoint(v=Variable(1.0))
    ckpt.save(tmp_path / "ckpt")
    with pytest.raises(NotFoundError, match=r"(?s)ckpt.*'-1'") as info:
        ckpt.restore(tmp_path / "ckpt")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.path == str(tmp_path / "ckpt")
    with pytest.raises(NotFoundError):
        ckpt.read(tmp_path / "nothing-here")


def test_d5_directory_resolves_through_state_file(tmp_path):
    v = Variable(1.0)
    ckpt = Checkpoint(v=v)
    ckpt.save(tmp_path / "run" / "ckpt")
    v.assign(5.0)
    ckpt.save(tmp_path / "run" / "ckpt")
    v.assign(0.0)
    ckpt.restore(tmp_path / "run").assert_consumed()
    assert v.numpy() == 5.0
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFoundError, match="directory without a committed checkpoint"):
        ckpt.restore(tmp_path / "empty")


def test_restore_into_program_built_after_restore(tmp_path):
    """Restore-then-create orders: restore first, then build parents before children and
    children before parents; both end up restored."""
    model = AutoTrackable()
    model.encoder = AutoTrackable()
    model.encoder.w = Variable([1.0, 2.0])
    model.head = Variable(3.0)
    path = Checkpoint(model=model).save(tmp_path / "ckpt")

    top_down = Checkpoint()
    status = top_down.restore(path)
    top_down.model = AutoTrackable()
    top_down.model.encoder = AutoTrackable()
    top_down.model.encoder.w = Variable([0.0, 0.0])
    top_down.model.head = Variable(0.0)
    status.assert_consumed()
    assert top_down.model.encoder.w.numpy().tolist() == [1.0, 2.0]

    bottom_up = Checkpoint()
    status = bottom_up.restore(path)
    encoder = AutoTrackable()
    encoder.w = Variable([0.0, 0.0])
    built = AutoTrackable()
    built.head = Variable(0.0)
    built.encoder = encoder
    bottom_up.model = built
    status.assert_consumed()
    assert encoder.w.numpy().tolist() == [1.0, 2.0] and built.head.numpy() == 3.0
