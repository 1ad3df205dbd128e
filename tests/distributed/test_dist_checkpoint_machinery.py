"""``DistributedCheckpoint`` saves through ``Checkpoint``'s own machinery (one process).

It is a ``tp.Checkpoint`` of the wrapped checkpoint's graph whose saver is the distributed one:
the save counter, the async writer and its ordering, ``sync`` and the write callbacks are the
base class's, so a one-rank save gives the same checkpoint as ``tp.Checkpoint.save``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import trackpoint as tp  # noqa: E402
import trackpoint.distributed as tpd  # noqa: E402
from trackpoint.bundle import BundleReader  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402


def _one_rank(**children: object) -> tpd.DistributedCheckpoint:
    return tpd.DistributedCheckpoint(group=tpd.LocalCollective(), **children)


def test_it_is_a_checkpoint_sharing_the_wrapped_graph_and_counter(tmp_path: Path) -> None:
    inner = tp.Checkpoint(w=np.arange(4, dtype=np.float32))
    ckpt = tpd.DistributedCheckpoint(inner, group=tpd.LocalCollective())
    assert isinstance(ckpt, tp.Checkpoint)
    assert ckpt.object_graph_view is inner.object_graph_view
    assert ckpt.save_counter is inner.save_counter
    assert isinstance(ckpt._make_saver(), tpd.DistributedSaver)

    path = ckpt.save(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt-1")
    assert int(inner.save_counter.numpy()) == 1
    assert tp.latest_checkpoint(tmp_path) == path
    # The same keys as the wrapped checkpoint writes by itself.
    plain = inner.write(tmp_path / "plain")
    with BundleReader(path) as ours, BundleReader(plain) as theirs:
        assert ours.keys() == theirs.keys()


def test_async_then_sync_saves_keep_their_order_and_callbacks(tmp_path: Path) -> None:
    value = np.zeros(3)
    ckpt = _one_rank(value=value)
    committed: list[str] = []
    options = tp.CheckpointOptions(enable_async=True, write_callbacks=(committed.append,))
    first = ckpt.save(tmp_path / "ckpt", options)
    value[:] = 1.0  # after the async call: not in the first checkpoint
    second = ckpt.save(tmp_path / "ckpt", tp.CheckpointOptions(write_callbacks=(committed.append,)))
    assert committed == [first, second]  # the sync save waited for the async one
    ckpt.sync()
    ckpt.close()
    assert tp.latest_checkpoint(tmp_path) == second
    np.testing.assert_array_equal(tp.load_variable(first, "value/.ATTRIBUTES/VARIABLE_VALUE"), 0)
    np.testing.assert_array_equal(tp.load_variable(second, "value/.ATTRIBUTES/VARIABLE_VALUE"), 1)


def test_restore_sets_the_shared_save_counter(tmp_path: Path) -> None:
    saved = _one_rank(value=np.ones(2))
    saved.save(tmp_path / "ckpt")
    path = saved.save(tmp_path / "ckpt")
    inner = tp.Checkpoint(value=np.zeros(2))
    ckpt = tpd.DistributedCheckpoint(inner, group=tpd.LocalCollective())
    ckpt.restore(path).assert_consumed()
    assert int(ckpt.save_counter.numpy()) == 2 and ckpt.save_counter is inner.save_counter
    assert ckpt.save(tmp_path / "ckpt") == str(tmp_path / "ckpt-3")


def test_a_distributed_checkpoint_cannot_wrap_another() -> None:
    with pytest.raises(InvalidArgumentError, match="tp.Checkpoint"):
        tpd.DistributedCheckpoint(_one_rank(value=np.ones(2)), group=tpd.LocalCollective())
