"""Issue 13 part 3: plain Python values in tracked dicts, lists and tuples are saved, restored in
place, readable by TensorFlow; anything else that is not trackable fails the save by path."""

from __future__ import annotations

import collections
import json
import logging
import math
import os

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError
from trackpoint.management import object_metadata
from trackpoint.tracking import AutoTrackable, NoDependency, Variable

STATE = "/.ATTRIBUTES/py_state"
Point = collections.namedtuple("Point", "x y")


def _json(path: str, key: str):  # noqa: ANN202
    return json.loads(np.asarray(tp.load_variable(path, key))[()])


def _keys(path: str) -> list[str]:
    return [name for name, _ in tp.list_variables(path)]


def _children(path: str, node_path: tuple[str, ...]) -> list[str]:
    graph = object_metadata(path)
    node = graph.nodes[0]
    for name in node_path:
        node = graph.nodes[next(c.node_id for c in node.children if c.local_name == name)]
    return [c.local_name for c in node.children]


def test_brief_example_epoch_and_tags_round_trip_in_place(tmp_path):
    extra = {"epoch": 3, "tags": ["a"]}
    path = tp.Checkpoint(model={"w": np.ones(2)}, extra=extra).write(tmp_path / "ckpt")
    assert _keys(path) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH", "extra" + STATE, "model/w/.ATTRIBUTES/VARIABLE_VALUE"
    ]
    assert _json(path, "extra" + STATE) == {"epoch": 3, "tags": ["a"]}

    tags = []
    live = {"epoch": 0, "tags": tags}
    tp.Checkpoint(model={"w": np.zeros(2)}, extra=live).read(path).assert_consumed()
    assert live["epoch"] == 3  # in the dict the caller passed
    assert live["tags"] == ["a"] and tags == ["a"]  # the caller's list, refilled in place


def test_every_plain_type_round_trips_with_its_type(tmp_path):
    value = {
        "none": None, "flag": True, "int": -4, "big": 2**70, "float": 0.25, "nan": math.nan,
        "inf": -math.inf, "str": "über", "bytes": b"\x00\xff", "complex": 1 + 2j,
        "f32": np.float32(0.5), "i8": np.int8(-3), "bool_": np.bool_(True),
        "tuple": (1, "a"), "point": Point(1, 2), "nested": {"list": [[], {}], "k": {1: "one"}},
    }
    extra = dict(value)
    ckpt = tp.Checkpoint(extra=extra)
    path = ckpt.write(tmp_path / "ckpt")
    for key in extra:
        extra[key] = "changed"
    extra["point"] = Point(0, 0)
    ckpt.read(path).assert_consumed()
    assert math.isnan(extra.pop("nan")) and math.isnan(value.pop("nan"))
    assert extra == value
    for key in ("f32", "i8", "bool_"):
        assert type(extra[key]) is type(value[key]), key
    assert type(extra["tuple"]) is tuple and type(extra["point"]) is Point
    assert isinstance(extra["complex"], complex) and extra["bytes"] == b"\x00\xff"


def test_storage_form_dict_list_and_mixed(tmp_path):
    path = tp.Checkpoint(
        table={"w": np.ones(2), "step": 3, "cfg": {"lr": 0.1, "sizes": [1, 2]}},
        history=[0.5, 0.25],
        mixed=[np.ones(1), 5, "s"],
        arrays=[np.ones(1)],
        empty=[],
    ).write(tmp_path / "ckpt")
    assert _keys(path) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH", "arrays/0/.ATTRIBUTES/VARIABLE_VALUE",
        "history" + STATE, "mixed" + STATE, "mixed/0/.ATTRIBUTES/VARIABLE_VALUE",
        "table" + STATE, "table/w/.ATTRIBUTES/VARIABLE_VALUE",
    ]
    assert _json(path, "table" + STATE) == {"step": 3, "cfg": {"lr": 0.1, "sizes": [1, 2]}}
    assert _json(path, "history" + STATE) == [0.5, 0.25]  # all plain: the list itself
    assert _json(path, "mixed" + STATE) == {"1": 5, "2": "s"}  # by index
    assert _children(path, ("table",)) == ["w"]  # a nested plain dict is not a node


def test_tensorflow_reads_the_plain_values(tmp_path, tf):
    path = tp.Checkpoint(
        model={"w": np.arange(3.0)}, extra={"epoch": 3, "tags": ["a"]}, history=[1, 2]
    ).write(tmp_path / "ckpt")
    reader = tf.train.load_checkpoint(path)
    assert reader.get_variable_to_dtype_map()["extra" + STATE] == tf.string
    assert json.loads(reader.get_tensor("extra" + STATE)) == {"epoch": 3, "tags": ["a"]}
    assert json.loads(reader.get_tensor("history" + STATE)) == [1, 2]
    np.testing.assert_array_equal(
        reader.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE"), np.arange(3.0)
    )


def test_saved_value_wins_over_a_live_value_of_another_type(tmp_path):
    path = tp.Checkpoint(extra={"epoch": 3, "tags": ["a"], "lr": 0.1}).write(tmp_path / "ckpt")
    live = {"epoch": "three", "tags": "a", "lr": np.float32(1.0)}
    tp.Checkpoint(extra=live).read(path).assert_consumed()
    assert live == {"epoch": 3, "tags": ["a"], "lr": 0.1}
    assert type(live["epoch"]) is int and type(live["lr"]) is float


def test_fresh_dict_gets_missing_keys_and_keeps_unsaved_ones(tmp_path, caplog):
    path = tp.Checkpoint(extra={"epoch": 3, "best": 0.5}).write(tmp_path / "ckpt")
    live = {"epoch": 0, "new_setting": 7}
    with caplog.at_level(logging.WARNING, logger="trackpoint.tracking"):
        tp.Checkpoint(extra=live).read(path).assert_consumed()
    assert live == {"epoch": 3, "new_setting": 7, "best": 0.5}
    assert "new_setting" in caplog.text and "keep their current values" in caplog.text


def test_lists_restore_in_place(tmp_path):
    path = tp.Checkpoint(history=[1, 2, 3], mixed=[np.ones(1), 5]).write(tmp_path / "ckpt")
    history, weights = [9], np.zeros(1)
    mixed = [weights, 0]
    tp.Checkpoint(history=history, mixed=mixed).read(path).assert_consumed()
    assert history == [1, 2, 3]  # the caller's list, resized in place
    assert mixed[1] == 5 and mixed[0] is weights and weights[0] == 1.0


def test_tuples_and_namedtuples(tmp_path):
    root = AutoTrackable()
    root.pair = (Variable(1.0), 7)
    root.table = {"point": Point(1, [2])}
    path = tp.Checkpoint(root=root).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.pair = (Variable(0.0), 0)
    fresh.table = {"point": Point(0, [0])}
    inner = fresh.table["point"].y
    tp.Checkpoint(root=fresh).read(path).assert_consumed()
    assert fresh.pair[0].numpy() == 1.0 and fresh.pair[1] == 7
    assert isinstance(fresh.table["point"], Point) and fresh.table["point"] == Point(1, [2])
    assert fresh.table["point"].y is inner  # nested list refilled in place


def test_plain_values_restore_on_attach(tmp_path):
    path = tp.Checkpoint(extra={"epoch": 3}).write(tmp_path / "ckpt")
    root = AutoTrackable()
    status = tp.Checkpoint(root=root).read(path)
    root.extra = {"epoch": 0}  # deferred restoration (B1)
    assert root.extra["epoch"] == 3
    status.assert_consumed()


@pytest.mark.parametrize(
    ("extra", "where", "kind"),
    [
        ({"handle": "file"}, r"\(root\)\.extra\['handle'\]", "TextIOWrapper"),
        ({"ok": 1, "s": {1, 2}}, r"\(root\)\.extra\['s'\]", "set"),
        ({"cfg": (1, object())}, r"\(root\)\.extra\['cfg'\]\[1\]", "object"),
        ({"deep": {"fn": [1, len]}}, r"\(root\)\.extra\.deep\.fn\[1\]", "builtin_function"),
        ({frozenset(): 1}, r"\(root\)\.extra key frozenset\(\)", "frozenset"),
    ],
    ids=["file", "set", "in-tuple", "nested", "key"],
)
def test_value_neither_trackable_nor_plain_fails_the_save_by_path(tmp_path, extra, where, kind):
    with open(__file__) as handle:
        extra = {k: handle if v == "file" else v for k, v in extra.items()}
        with pytest.raises(InvalidArgumentError, match=f"Cannot save {where}.*{kind}") as info:
            tp.Checkpoint(model={"w": np.ones(1)}, extra=extra).write(tmp_path / "ckpt")
    message = str(info.value)
    assert "tp.PythonState" in message and "NoDependency" in message
    assert not os.path.exists(tmp_path / "ckpt.index")  # nothing written


def test_value_in_a_list_fails_the_save_by_index(tmp_path):
    root = AutoTrackable()
    root.items = [1, np.ones(1), print]
    with pytest.raises(InvalidArgumentError, match=r"Cannot save \(root\)\.items\[2\]"):
        tp.Checkpoint(root=root).write(tmp_path / "ckpt")


def test_no_dependency_entries_are_neither_saved_nor_checked(tmp_path):
    ckpt = tp.Checkpoint(extra={"epoch": 1}, items=[1])
    with open(__file__) as handle:
        ckpt.extra["handle"] = NoDependency(handle)
        ckpt.items.append(NoDependency(handle))
        path = ckpt.write(tmp_path / "ckpt")
        assert ckpt.extra["handle"] is handle
        assert _json(path, "extra" + STATE) == {"epoch": 1}
        assert _json(path, "items" + STATE) == {"0": 1}
        copied = ckpt.extra.copy()
        copied._check_saveable("(copy)")  # the copy keeps the entry out too


def test_nothing_is_silently_dropped_or_passed(tmp_path):
    bare = tp.Checkpoint(model={"w": np.ones(1)}).write(tmp_path / "bare")
    # The program holds plain values the checkpoint lacks: reported, not passed.
    status = tp.Checkpoint(model={"w": np.zeros(1)}, extra={"epoch": 0}).read(bare)
    with pytest.raises(AssertionError, match=r"\(root\)\.extra"):
        status.assert_existing_objects_matched()
    status.expect_partial()
    # A checkpoint with plain values read into a program without them: reported.
    full = tp.Checkpoint(model={"w": np.ones(1)}, extra={"epoch": 3}).write(tmp_path / "full")
    with pytest.raises(AssertionError, match=r"Unresolved object.*\(root\)\.extra"):
        tp.Checkpoint(model={"w": np.zeros(1)}).read(full).expect_partial().assert_consumed()
    # An empty container on its own has no values to receive them (documented limit): loud.
    with pytest.raises(AssertionError, match=r"(?s)Unused attributes.*\(root\)\.extra.*py_state"):
        tp.Checkpoint(model={"w": np.zeros(1)}, extra={}).read(full).expect_partial() \
            .assert_consumed()


def test_plain_value_where_the_program_holds_a_trackable_fails_before_any_change(tmp_path):
    path = tp.Checkpoint(model={"w": np.ones(2)}, extra={"epoch": 3}).write(tmp_path / "ckpt")
    weights, epoch = np.zeros(2), np.zeros(())
    with pytest.raises(InvalidArgumentError, match=r"keys \['epoch'\].*trackable"):
        tp.Checkpoint(model={"w": weights}, extra={"epoch": epoch, "note": ""}).read(path)
    assert weights.tolist() == [0.0, 0.0]  # all or nothing
    saved = tp.Checkpoint(extra=[np.ones(1), 2, 3]).write(tmp_path / "list")
    with pytest.raises(InvalidArgumentError, match="index '2' of a list.*has 2 elements"):
        tp.Checkpoint(extra=[weights, 0]).read(saved)
    assert weights.tolist() == [0.0, 0.0]


def test_async_save_snapshots_plain_values_at_the_call(tmp_path):
    extra = {"epoch": 1, "tags": ["a"]}
    ckpt = tp.Checkpoint(model={"w": np.ones(4)}, extra=extra)
    path = ckpt.write(tmp_path / "ckpt", tp.CheckpointOptions(enable_async=True))
    extra["epoch"] = 2
    extra["tags"].append("b")
    ckpt.sync()
    assert _json(path, "extra" + STATE) == {"epoch": 1, "tags": ["a"]}


def test_changes_to_the_callers_nested_lists_and_dicts_are_saved(tmp_path):
    tags, cfg = ["a"], {"lr": 0.1}
    ckpt = tp.Checkpoint(extra={"tags": tags, "cfg": cfg, "epoch": 1})
    ckpt.write(tmp_path / "a")
    tags.append("b")  # on the caller's own objects, behind the wrappers
    cfg["lr"] = 0.2
    path = ckpt.write(tmp_path / "b")
    assert _json(path, "extra" + STATE) == {"tags": ["a", "b"], "cfg": {"lr": 0.2}, "epoch": 1}
    tags.clear()
    cfg.clear()
    ckpt.read(path).assert_consumed()
    assert tags == ["a", "b"] and cfg == {"lr": 0.2}  # restored into the caller's objects
