"""Tracked containers: naming, mirroring, mutation bookkeeping, copies."""

from __future__ import annotations

import collections
import copy
import json

import numpy as np
import pytest

from trackpoint.tracking import (
    AutoTrackable,
    DictWrapper,
    ListWrapper,
    NoDependency,
    TupleWrapper,
    Variable,
)

Point = collections.namedtuple("Point", "x y")


def test_list_wrapper_is_a_list():
    obj = AutoTrackable()
    obj.items = [1, 2]
    assert isinstance(obj.items, list) and isinstance(obj.items, ListWrapper)
    assert json.dumps(obj.items) == "[1, 2]"
    assert obj.items + [3] == [1, 2, 3] and obj.items == [1, 2]
    with pytest.raises(TypeError):
        hash(obj.items)


def test_list_children_names_and_nested_wrapping():
    v = Variable(1.0)
    obj = AutoTrackable()
    obj.items = [v, [Variable(2.0)], {"k": np.zeros(1)}, 5]
    children = obj.items._trackable_children()
    assert list(children) == ["0", "1", "2"]
    assert children["0"] is v
    assert isinstance(obj.items[1], ListWrapper) and isinstance(obj.items[2], DictWrapper)
    obj.items.append(Variable(3.0))
    assert "4" in obj.items._trackable_children()


def test_deferred_restoration_on_append():
    log = []

    class Position:
        restore_uid = 1

        def restore(self, trackable):
            log.append(trackable)

        def value_spec(self):
            return None

    obj = AutoTrackable()
    obj.items = []
    obj.items._deferred_dependencies["0"] = [Position()]
    v = Variable(1.0)
    obj.items.append(v)
    assert log == [v]


def test_dict_wrapper_mirrors_and_detects_external_changes():
    original = {"a": Variable(1.0)}
    obj = AutoTrackable()
    obj.table = original
    obj.table["b"] = Variable(2.0)
    assert set(original) == {"a", "b"}
    del obj.table["a"]
    assert set(obj.table._trackable_children()) == {"b"}
    assert "a" not in original
    original["c"] = Variable(3.0)  # outside the wrapper: adopted at the next save (issue 13)
    assert set(obj.table._trackable_children()) == {"b", "c"}
    assert obj.table["c"] is original["c"]


def test_dict_non_string_key_with_trackable():
    obj = AutoTrackable()
    obj.table = {1: "plain is fine"}
    obj.table._trackable_children()
    obj.table[2] = Variable(1.0)
    with pytest.raises(ValueError, match="non-string key"):
        obj.table._trackable_children()


def test_dict_update_pop_setdefault():
    obj = AutoTrackable()
    obj.table = {}
    v = Variable(1.0)
    obj.table.update(a=v)
    assert obj.table.setdefault("a") is v
    assert obj.table.pop("a") is v and obj.table._trackable_children() == {}
    assert obj.table.pop("missing", None) is None
    obj.table["x"] = NoDependency(Variable(2.0))
    assert obj.table._trackable_children() == {}


def test_tuple_wrapper_namedtuple():
    v = Variable(1.0)
    obj = AutoTrackable()
    obj.point = Point(v, [np.zeros(2)])
    assert isinstance(obj.point, Point) and isinstance(obj.point, tuple)
    assert isinstance(obj.point, TupleWrapper)
    assert obj.point.x is v and obj.point[0] is v
    assert obj.point._asdict()["x"] is v
    assert list(obj.point._trackable_children()) == ["x", "y", "0", "1"]
    assert obj.point == Point(v, obj.point.y)
    obj.plain = (1, 2)
    assert type(obj.plain) is tuple  # nothing trackable inside: not wrapped


def test_unconstructable_namedtuple_cannot_be_saved():
    class Odd(collections.namedtuple("Odd", "a b")):
        def __new__(cls, value):
            return super().__new__(cls, value, value)

    obj = AutoTrackable()
    obj.odd = Odd(Variable(1.0))
    with pytest.raises(ValueError, match="not constructable"):
        obj.odd._trackable_children()


def test_copies():
    v = Variable(1.0)
    obj = AutoTrackable()
    obj.items = [v]
    obj.table = {"v": v}
    shallow = copy.copy(obj.items)
    assert isinstance(shallow, ListWrapper) and shallow[0] is v
    deep = copy.deepcopy(obj.items)
    assert deep[0] is not v and deep[0].numpy() == 1.0
    deep_table = copy.deepcopy(obj.table)
    assert isinstance(deep_table, DictWrapper) and deep_table["v"] is not v
    obj.items.sort(key=id)
    assert copy.copy(obj.items)._self_non_append_mutation


def test_list_of_plain_values_mutates_freely():
    obj = AutoTrackable()
    obj.items = [3, 1, 2]
    obj.items.sort()
    obj.items.reverse()
    del obj.items[0]
    obj.items.insert(0, 9)
    assert obj.items == [9, 2, 1]
    assert obj.items._trackable_children() == {}
