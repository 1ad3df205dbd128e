"""ValueColumns: a batch's restored values, one list per name, read as a sequence of mappings."""

from __future__ import annotations

import pytest

from trackpoint.tracking.value_columns import ValueColumns


def test_rows_are_mappings_built_from_the_columns() -> None:
    columns = ValueColumns({"a": [1, 2, 3], "b": [4, 5, 6]})
    assert len(columns) == 3
    assert columns[1] == {"a": 2, "b": 5}
    assert columns[-1] == {"a": 3, "b": 6}
    assert list(columns) == [{"a": 1, "b": 4}, {"a": 2, "b": 5}, {"a": 3, "b": 6}]
    assert list(columns[1:]) == [{"a": 2, "b": 5}, {"a": 3, "b": 6}]
    assert columns.column("b") == [4, 5, 6]
    with pytest.raises(IndexError):
        columns[3]


def test_append_and_extend_keep_the_names() -> None:
    columns = ValueColumns({"a": [1]})
    columns.append({"a": 2})
    columns.extend(ValueColumns({"a": [3, 4]}))
    assert columns.column("a") == [1, 2, 3, 4] and len(columns) == 4
    with pytest.raises(ValueError, match="values named"):
        columns.append({"b": 5})
    with pytest.raises(ValueError, match="different lengths"):
        ValueColumns({"a": [1], "b": []})
