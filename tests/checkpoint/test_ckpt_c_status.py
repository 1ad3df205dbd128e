"""Scenarios C1–C6: load status assertions, the partial-restore warning, options."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest
from ckpt_helpers import NumpyAdam

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking import AutoTrackable, Variable


def _two_vars(tmp_path):
    root = AutoTrackable()
    root.v1 = Variable(1.0)
    root.v2 = Variable(2.0)
    return Checkpoint(root=root).write(tmp_path / "ckpt")


# -- C1 --------------------------------------------------------------------------------------


def test_c1_assert_consumed_passes_and_chains_even_after_checkpoint_deleted(tmp_path):
    v = Variable(0.0)
    ckpt = Checkpoint(v=v)
    path = ckpt.save(tmp_path / "ckpt")
    status = ckpt.restore(path)
    del ckpt
    gc.collect()
    assert status.assert_consumed() is status
    assert status.assert_existing_objects_matched().assert_nontrivial_match() is status


def test_c1_unused_attributes(tmp_path):
    path = _two_vars(tmp_path)
    fresh = AutoTrackable()
    fresh.v1 = AutoTrackable()  # matched, but has no value to take VARIABLE_VALUE
    fresh.v2 = Variable(0.0)
    status = Checkpoint(root=fresh).read(path)
    with pytest.raises(AssertionError, match=r"(?s)Unused attributes.*\(root\)\.v1"):
        status.assert_consumed()
    status.expect_partial()


def test_c1_unresolved_object(tmp_path):
    path = _two_vars(tmp_path)
    fresh = AutoTrackable()
    fresh.v1 = Variable(0.0)
    status = Checkpoint(root=fresh).read(path).expect_partial()
    with pytest.raises(AssertionError, match=r"Unresolved object in checkpoint \(root\)\.v2"):
        status.assert_consumed()


def test_c1_python_object_not_bound(tmp_path):
    path = _two_vars(tmp_path)
    fresh = AutoTrackable()
    fresh.v1 = Variable(0.0)
    fresh.v2 = Variable(0.0)
    fresh.v3 = Variable(0.0)
    status = Checkpoint(root=fresh).read(path)
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*\(root\)\.v3"):
        status.assert_consumed()


# -- C2 --------------------------------------------------------------------------------------


def test_c2_existing_objects_matched_with_missing_optimizer_in_file(tmp_path):
    model = AutoTrackable()
    model.w = Variable([1.0, 2.0])
    path = Checkpoint(model=model).save(tmp_path / "ckpt")

    fresh = AutoTrackable()
    fresh.w = Variable([0.0, 0.0])
    optimizer = NumpyAdam()
    optimizer.apply_gradients([(np.ones(2), fresh.w)])
    status = Checkpoint(model=fresh, optimizer=optimizer).restore(path)
    with pytest.raises(AssertionError, match=r"not bound.*\(root\)\.optimizer\.beta1_power"):
        status.assert_existing_objects_matched()


def test_c2_passes_while_deferred_children_missing(tmp_path):
    path = _two_vars(tmp_path)
    status = Checkpoint(root=AutoTrackable()).read(path)
    status.assert_existing_objects_matched()
    status.expect_partial()


# -- C3 --------------------------------------------------------------------------------------


def test_c3_assert_nontrivial_match(tmp_path):
    path = _two_vars(tmp_path)
    status = Checkpoint(root=AutoTrackable()).read(path).expect_partial()
    with pytest.raises(AssertionError, match="Nothing except the root object matched"):
        status.assert_nontrivial_match()
    unrelated = AutoTrackable()
    unrelated.other = Variable(0.0)
    status = Checkpoint(root=unrelated).read(path).expect_partial()
    with pytest.raises(AssertionError, match=r"Nothing except the root.*\(root\)\.other"):
        status.assert_nontrivial_match()
    partial = AutoTrackable()
    partial.v1 = Variable(0.0)
    Checkpoint(root=partial).read(path).expect_partial().assert_nontrivial_match()


# -- C4 --------------------------------------------------------------------------------------


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING]


def test_c4_partial_restore_warns_once_when_dropped(tmp_path, caplog):
    path = _two_vars(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trackpoint"):
        fresh = AutoTrackable()
        fresh.v1 = AutoTrackable()
        ckpt = Checkpoint(root=fresh)
        status = ckpt.read(path)
        assert _warnings(caplog) == []
        del ckpt, fresh, status
        gc.collect()
    records = _warnings(caplog)
    assert len(records) == 1
    message = records[0].getMessage()
    assert "(root).v2" in message and "(root).v1" in message
    assert "expect_partial()" in message


def test_c4_expect_partial_silences_and_full_match_is_silent(tmp_path, caplog):
    path = _two_vars(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trackpoint"):
        fresh = AutoTrackable()
        status = Checkpoint(root=fresh).read(path).expect_partial()
        del fresh, status
        full = AutoTrackable()
        full.v1, full.v2 = Variable(0.0), Variable(0.0)
        status = Checkpoint(root=full).read(path)
        del full, status
        gc.collect()
    assert _warnings(caplog) == []


# -- C5 --------------------------------------------------------------------------------------


def test_c5_restore_none_is_initialization_only(tmp_path):
    path = _two_vars(tmp_path)
    root = AutoTrackable()
    root.v1 = Variable(0.0)
    root.v2 = Variable(0.0)
    ckpt = Checkpoint(root=root)
    restored = ckpt.read(path)
    init_only = ckpt.restore(None)
    for assertion in (init_only.assert_consumed, init_only.assert_existing_objects_matched,
                      init_only.assert_nontrivial_match):
        with pytest.raises(AssertionError, match="No checkpoint specified"):
            assertion()
    init_only.initialize_or_restore()
    restored.initialize_or_restore()
    assert root.v1.numpy() == 1.0 and root.v2.numpy() == 2.0
    assert int(ckpt.save_counter.numpy()) == 0


# -- C6 --------------------------------------------------------------------------------------


def test_c6_options_accepted_by_save_and_restore(tmp_path):
    v = Variable(1.0)
    ckpt = Checkpoint(v=v)
    options = CheckpointOptions(num_io_threads=2)
    path = ckpt.save(tmp_path / "ckpt", options=options)
    v.assign(0.0)
    ckpt.restore(path, options=options).assert_consumed()
    assert v.numpy() == 1.0
    path2 = ckpt.write(tmp_path / "w", options)
    ckpt.read(path2, options).assert_consumed()


def test_c6_bad_options_rejected():
    with pytest.raises(ValueError, match="sharding_policy"):
        CheckpointOptions(sharding_policy="not a callable")
    with pytest.raises(ValueError, match="write callback"):
        CheckpointOptions(write_callbacks=[lambda a, b: None])
    with pytest.raises(InvalidArgumentError, match="CheckpointOptions"):
        Checkpoint(v=Variable(1.0)).write("/nonexistent/never", options={"enable_async": True})
