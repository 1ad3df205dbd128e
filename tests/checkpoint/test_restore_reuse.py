"""Reads of one Checkpoint reuse the restore walk, exactly while nothing it depends on changed.

A ``Checkpoint`` read again from a checkpoint with the same object graph (equal bytes), while
the program's structure is unchanged, replays its last walk instead of walking (issue 19).
Each test changes one thing the walk depends on — an entry rebound, a key added or removed, a
nested container changed, another graph written, a failed read — and checks that the read
then behaves as a fresh ``Checkpoint`` over the same objects does: values, the load status's
assertions, deferred restoration (B1), the newest requested restore winning (B4), and
all-or-nothing.
"""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.checkpoint.restore import CheckpointPosition
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.management import CheckpointReader
from trackpoint.tracking import AutoTrackable, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Node ids at which a restore walk started (0: a read walked; else deferred)."""
    started: list[int] = []
    walk = CheckpointPosition._walk

    def counting(self: CheckpointPosition, *args: Any) -> None:
        started.append(self.proto_id)
        walk(self, *args)

    monkeypatch.setattr(CheckpointPosition, "_walk", counting)
    return started


def reads_walked(walks: list[int]) -> int:
    return walks.count(0)


def values(seed: float, *, keys: tuple[str, ...] = ("a/b", "c", "d.e")) -> dict[str, Any]:
    return {key: np.arange(3 + i, dtype=np.float32) + seed for i, key in enumerate(keys)}


def write(tmp_path: Path, name: str, state: dict[str, Any]) -> str:
    return tp.Checkpoint(state=state).write(str(tmp_path / name))


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        key: zeros_like(value) if isinstance(value, dict) else np.zeros_like(value)
        for key, value in state.items()
    }


def graph_bytes(prefix: str) -> bytes:
    with CheckpointReader(prefix) as reader:
        data: bytes = reader.bundle.read(OBJECT_GRAPH_KEY).item()
    return data


def assert_values(state: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(state) == set(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_values(state[key], value)
        else:
            np.testing.assert_array_equal(state[key], value, err_msg=key)


def outcome(status: tp.LoadStatus) -> dict[str, str]:
    """What each assertion of ``status`` says: "ok" or the error's type and first words."""
    said = {}
    for name in ("assert_consumed", "assert_existing_objects_matched", "assert_nontrivial_match"):
        try:
            getattr(status, name)()
            said[name] = "ok"
        except AssertionError as exc:
            said[name] = str(exc).split(":")[0][:60]
    return said


def fresh_outcome(state: dict[str, Any], prefix: str) -> dict[str, str]:
    """The assertions of a fresh Checkpoint over a copy of ``state`` (the reference)."""
    return outcome(tp.Checkpoint(state=copy.deepcopy(state)).read(prefix).expect_partial())


# -- reuse -------------------------------------------------------------------------------------


def test_repeated_reads_of_one_graph_walk_once(tmp_path, walks):
    first, second = values(1.0), values(10.0)
    p1, p2 = write(tmp_path, "one", first), write(tmp_path, "two", second)
    assert graph_bytes(p1) == graph_bytes(p2)  # the same program: the same graph
    state = zeros_like(first)
    arrays = {key: state[key] for key in state}
    ckpt = tp.Checkpoint(state=state)
    for prefix, expected in [(p1, first), (p2, second), (p1, first), (p2, second)]:
        ckpt.read(prefix).assert_consumed()
        assert_values(state, expected)
    assert reads_walked(walks) == 1
    assert all(state[key] is arrays[key] for key in state)  # in place (B3)


def test_reused_read_restores_in_place_after_values_changed(tmp_path, walks):
    saved = values(2.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    for array in state.values():
        array += 5.0  # training steps: values change, structure does not
    ckpt.read(prefix).assert_consumed()
    assert_values(state, saved)
    assert reads_walked(walks) == 1


def test_reuse_keeps_plain_values_current(tmp_path, walks):
    saved = {"w": np.ones(2, np.float32), "lr": 0.1, "names": ["x", "y"]}
    prefix = write(tmp_path, "ckpt", saved)
    state = {"w": np.zeros(2, np.float32), "lr": 0.5, "names": ["z"]}
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    assert state["lr"] == 0.1 and state["names"] == ["x", "y"]
    state["lr"], state["names"] = 0.7, []  # plain values: not the structure
    ckpt.read(prefix).assert_consumed()
    assert state["lr"] == 0.1 and state["names"] == ["x", "y"]
    assert reads_walked(walks) == 1


# -- invalidation: the program's structure -------------------------------------------------------


def test_entry_rebound_through_the_checkpoint_walks_again(tmp_path, walks):
    saved = values(3.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    old = ckpt.state["c"]
    old[:] = -1.0
    ckpt.state["c"] = new = np.zeros(4, np.float32)
    ckpt.read(prefix).assert_consumed()
    np.testing.assert_array_equal(new, saved["c"])
    np.testing.assert_array_equal(old, -1.0)  # no longer the program's: not written
    assert reads_walked(walks) == 2


def test_entry_rebound_on_the_users_dict_walks_again(tmp_path, walks):
    saved = values(4.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    old = state["a/b"]
    old[:] = -1.0
    state["a/b"] = new = np.zeros(3, np.float32)  # behind the tracked dict's back
    ckpt.read(prefix).assert_consumed()
    np.testing.assert_array_equal(new, saved["a/b"])
    np.testing.assert_array_equal(old, -1.0)
    assert reads_walked(walks) == 2


def test_key_added_walks_again_and_is_reported(tmp_path, walks):
    saved = values(5.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    state["extra"] = np.full(2, 7.0, np.float32)
    status = ckpt.read(prefix).expect_partial()
    assert reads_walked(walks) == 2
    assert outcome(status) == fresh_outcome(state, prefix)
    assert "not bound" in outcome(status)["assert_consumed"]
    np.testing.assert_array_equal(state["extra"], 7.0)


def test_key_removed_walks_again_and_is_reported(tmp_path, walks):
    saved = values(6.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    del ckpt.state["c"]
    status = ckpt.read(prefix).expect_partial()
    assert reads_walked(walks) == 2
    assert outcome(status) == fresh_outcome(state, prefix)
    assert outcome(status)["assert_consumed"].startswith("Unresolved object")
    assert_values(state, {k: v for k, v in saved.items() if k != "c"})


def test_nested_container_changed_walks_again(tmp_path, walks):
    saved = {"inner": values(7.0), "top": np.ones(2, np.float32)}
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    ckpt.read(prefix).assert_consumed()
    assert reads_walked(walks) == 1
    ckpt.state["inner"]["c"] = replaced = np.zeros(4, np.float32)  # one level down
    ckpt.read(prefix).assert_consumed()
    np.testing.assert_array_equal(replaced, saved["inner"]["c"])
    ckpt.state["inner"] = new_inner = zeros_like(saved["inner"])  # the container itself
    ckpt.read(prefix).assert_consumed()
    assert_values(new_inner, saved["inner"])
    assert reads_walked(walks) == 3


def test_structure_changed_after_the_read_is_seen_by_the_assertions(tmp_path):
    saved = values(8.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).assert_consumed()
    status = ckpt.read(prefix)  # reused
    status.assert_consumed()
    state["late"] = np.ones(1, np.float32)  # after the read, before the assertion
    with pytest.raises(AssertionError, match="not bound to checkpointed values"):
        status.assert_consumed()
    status.expect_partial()


# -- invalidation: the checkpoint ----------------------------------------------------------------


def test_another_graph_walks_again(tmp_path, walks):
    small, large = values(1.0), values(2.0, keys=("a/b", "c", "d.e", "f"))
    p_small, p_large = write(tmp_path, "small", small), write(tmp_path, "large", large)
    state = zeros_like(small)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(p_small).assert_consumed()
    status = ckpt.read(p_large).expect_partial()  # one more node: another graph
    ckpt.read(p_small).assert_consumed()
    assert_values(state, small)
    assert reads_walked(walks) == 3
    assert outcome(status) == fresh_outcome(state, p_large)
    assert outcome(status)["assert_consumed"].startswith("Unresolved object")


def test_damaged_value_on_a_reused_read_changes_nothing(tmp_path, walks, corrupt):
    good, other = values(1.0), values(9.0)
    p_good, p_bad = write(tmp_path, "good", good), write(tmp_path, "bad", other)
    corrupt(p_bad, "state/c" + VV)
    state = zeros_like(good)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(p_good).assert_consumed()
    with pytest.raises(DataLossError):
        ckpt.read(p_bad)  # same graph: replayed, then the value fails its crc32c
    assert_values(state, good)  # nothing changed, not even the undamaged values
    ckpt.read(p_good).assert_consumed()  # a failed read keeps nothing: walks again
    assert_values(state, good)
    assert reads_walked(walks) == 2


def test_value_that_does_not_fit_on_a_reused_read_changes_nothing(tmp_path, walks):
    fits = values(1.0)
    p_fits = write(tmp_path, "fits", fits)
    p_other = write(tmp_path, "other", {**values(2.0), "c": np.ones(9, np.float32)})
    assert graph_bytes(p_fits) == graph_bytes(p_other)  # shapes are not in the graph
    state = zeros_like(fits)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(p_fits).assert_consumed()
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        ckpt.read(p_other)
    assert_values(state, fits)
    assert reads_walked(walks) == 1



# -- deferred restoration and B4 -----------------------------------------------------------------


def test_b1_b4_deferred_values_come_from_the_newest_reused_read(tmp_path, walks):
    p1, p2 = write(tmp_path, "one", values(1.0)), write(tmp_path, "two", values(2.0))
    state = {"a/b": np.zeros(3, np.float32), "d.e": np.zeros(5, np.float32)}  # no "c" yet
    ckpt = tp.Checkpoint(state=state)
    first = ckpt.read(p1)
    second = ckpt.read(p2)  # replayed: "c" waits again, for this newer read
    assert reads_walked(walks) == 1
    for status in (first, second):
        status.assert_existing_objects_matched()
        with pytest.raises(AssertionError, match="Unresolved object"):
            status.assert_consumed()
    ckpt.state["c"] = late = np.zeros(4, np.float32)  # attach: deferred restoration
    np.testing.assert_array_equal(late, values(2.0)["c"])  # the newest requested read wins
    second.assert_consumed()
    first.expect_partial()
    assert_values(state, values(2.0))


def test_b4_a_deferred_older_read_leaves_newer_values_alone(tmp_path, walks):
    p1, p2 = write(tmp_path, "one", values(1.0)), write(tmp_path, "two", values(2.0))
    state = {"a/b": np.zeros(3, np.float32), "d.e": np.zeros(5, np.float32)}
    ckpt = tp.Checkpoint(state=state)
    old = ckpt.read(p1)
    new = ckpt.read(p2)
    late = np.zeros(4, np.float32)
    ckpt.state["c"] = late  # both reads wait for "c": the newer applies, the older skips
    np.testing.assert_array_equal(late, values(2.0)["c"])
    assert sorted(walks) == [0, 3, 3]  # one read walked; two deferred walks of "c"
    new.assert_consumed()
    old.assert_existing_objects_matched()  # newer values count, as in TensorFlow
    old.expect_partial()
    assert_values(state, values(2.0))


# -- objects the walk shares or does not own -----------------------------------------------------


def test_object_reached_twice_is_not_reused_but_restores_as_before(tmp_path, walks):
    shared = np.arange(3, dtype=np.float32)
    prefix = tp.Checkpoint(a=shared, b=shared).write(str(tmp_path / "ckpt"))
    target = np.zeros(3, np.float32)
    ckpt = tp.Checkpoint(a=target, b=target)
    for _ in range(2):
        ckpt.read(prefix).assert_consumed()
        np.testing.assert_array_equal(target, shared)


def test_weak_root_is_not_kept_alive_by_reuse(tmp_path):
    root = AutoTrackable()
    root.v = Variable(np.arange(3.0))
    prefix = tp.Checkpoint(root=root).write(str(tmp_path / "ckpt"))
    ckpt = tp.Checkpoint(root=weakref.ref(root))
    ckpt.read(prefix).assert_consumed()
    ckpt.read(prefix).assert_consumed()
    gone = weakref.ref(root)
    del root
    gc.collect()
    assert gone() is None


def test_deepcopy_reads_into_its_own_objects(tmp_path, walks):
    saved = values(3.0)
    prefix = write(tmp_path, "ckpt", saved)
    ckpt = tp.Checkpoint(state=zeros_like(saved))
    ckpt.read(prefix).assert_consumed()
    twin = copy.deepcopy(ckpt)
    twin.state["c"][:] = -2.0
    ckpt.state["c"][:] = -3.0
    twin.read(prefix).assert_consumed()
    np.testing.assert_array_equal(ckpt.state["c"], -3.0)  # the original's are not the copy's
    np.testing.assert_array_equal(twin.state["c"], saved["c"])


@pytest.mark.parametrize(
    "change",
    [
        lambda ckpt, state: None,
        lambda ckpt, state: state.update(c=np.zeros(4, np.float32)),
        lambda ckpt, state: state.pop("c"),
        lambda ckpt, state: state.update(z=np.zeros(1, np.float32)),
        lambda ckpt, state: ckpt.state.update(c=np.zeros(4, np.float32)),
        lambda ckpt, state: state.update(plain=3),
    ],
    ids=["nothing", "rebind", "remove", "add", "rebind-tracked", "plain"],
)
def test_each_read_says_what_a_fresh_checkpoint_says(
    tmp_path: Path, change: Callable[[tp.Checkpoint, dict[str, Any]], None]
) -> None:
    saved = values(4.0)
    prefix = write(tmp_path, "ckpt", saved)
    state = zeros_like(saved)
    ckpt = tp.Checkpoint(state=state)
    ckpt.read(prefix).expect_partial()
    change(ckpt, state)
    reference = copy.deepcopy(state)
    expected = fresh_outcome(reference, prefix)
    reference_values = tp.Checkpoint(state=reference)
    reference_values.read(prefix).expect_partial()
    status = ckpt.read(prefix).expect_partial()
    assert outcome(status) == expected
    assert_values(state, dict(reference))
