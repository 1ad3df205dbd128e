"""`ValueColumns`: the values of many objects, each restored whole, as one list per value name.

``Trackable._prepare_restores(trackables, restored, on_error)`` receives ``restored[i]``, the
``{name: array}`` of ``trackables[i]``. When the restore engine planned the objects as a batch
(their class declares ``_whole_value_names``), it hands over this sequence instead of a list of
100,000 one-entry dicts: ``restored[i]`` is still that mapping (built on access, so the
per-object default works unchanged), and a class's batch form may take a whole column at once
with :meth:`ValueColumns.column` (``Variable._prepare_restores`` does).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

__all__ = ["ValueColumns"]


class ValueColumns(Sequence[Mapping[str, Any]]):
    """``restored`` of a batch: ``{name: [value of object 0, value of object 1, ...]}``.

    Args:
        columns: one list per value name, all of one length (the objects', in order). Kept, not
            copied: the engine made them for this call.
    """

    __slots__ = ("_columns", "_length")

    def __init__(self, columns: Mapping[str, list[Any]]) -> None:
        self._columns = dict(columns)
        lengths = {len(column) for column in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"value columns of different lengths: {sorted(lengths)}")
        self._length = lengths.pop() if lengths else 0

    @property
    def names(self) -> tuple[str, ...]:
        """The value names, in column order."""
        return tuple(self._columns)

    def append(self, values: Mapping[str, Any]) -> None:
        """Add one object's ``{name: value}`` (exactly this sequence's names) at the end: for
        the engine, while it gathers the objects of one class, before it hands them over."""
        if values.keys() != self._columns.keys():
            raise ValueError(f"values named {sorted(values)}, columns {sorted(self._columns)}")
        for name, column in self._columns.items():
            column.append(values[name])
        self._length += 1

    def extend(self, other: ValueColumns) -> None:
        """Add every object of ``other`` (the same names) at the end (see :meth:`append`)."""
        if other.names != self.names:
            raise ValueError(f"columns {list(other.names)}, expected {list(self.names)}")
        for name, column in self._columns.items():
            column.extend(other.column(name))
        self._length += len(other)

    def column(self, name: str) -> list[Any]:
        """The values named ``name`` of every object, in order (the engine's list: do not
        change it)."""
        return self._columns[name]

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
        if isinstance(index, slice):
            return ValueColumns({name: column[index] for name, column in self._columns.items()})
        if not -self._length <= index < self._length:
            raise IndexError(f"object {index} of {self._length}")
        return {name: column[index] for name, column in self._columns.items()}

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        names = list(self._columns)
        for row in zip(*self._columns.values()):
            yield dict(zip(names, row))
