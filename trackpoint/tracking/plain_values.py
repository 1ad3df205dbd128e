"""Plain Python values held by tracked containers: what is plain, its JSON, in-place restore.

A *plain value* is ``None``, a ``bool``, ``int``, ``float``, ``complex``, ``str`` or ``bytes``
(exactly those types), a numpy scalar of a dtype a checkpoint can store, or a list, tuple
(namedtuples included) or dict (``OrderedDict``, ``defaultdict``) made only of plain values, at
any depth; a tracked list/dict/tuple wrapper with no trackable inside counts as its plain
contents. Tracked containers (``containers.py``, ``mappings.py``) save their plain entries;
this module decides what is plain, encodes and decodes it with ``state_json`` (strict JSON,
never pickle) and merges restored values into live ones in place.

Storage form (issue 13): a container's plain entries are ONE JSON value on the container's
own node, ``<container path>/.ATTRIBUTES/py_state`` (a DT_STRING scalar under TensorFlow's
``PythonState`` attribute name; ``tf.train.load_checkpoint(p).get_tensor(key)`` returns the
JSON bytes), written only if the container has at least one plain entry:

* a dict: a JSON object of its plain entries by key, ``{"epoch": 3, "tags": ["a"]}``;
* a list or tuple: a JSON array of the elements if every element is plain, ``[1, 2, 3]``, else
  a JSON object of the plain elements by index, ``{"1": 5}``;
* a nested list, dict or tuple that holds no trackable is part of its parent's JSON (as
  ``"tags"`` above), not a node of its own; it becomes a node once it holds a trackable;
* tuples, bytes, non-finite floats and non-string keys use ``state_json``'s tags; numpy
  scalars are 0-d arrays there, so they come back with their dtype.

Restoring is in place: into the same dict or list (and so into the one the user passed, which
the wrapper mirrors into); nested lists and dicts are refilled in place; a dict gets back keys
the program lacks. The saved value wins over a live value of another plain type (saved ``3``,
live ``"x"``: ``3``), since the JSON records what was saved. Plain keys the checkpoint lacks
keep their values (logged). A saved plain value where the program now holds a trackable, or a
list index the program's list does not have, fails the restore before anything changes.
An empty list or dict inside a container is one of its plain values (``{"history": []}``
saves ``{"history": []}``, so a restore refills it in place); a container that is itself empty
or holds only trackables saves nothing of its own (its key list is TensorFlow's), so an empty
list or dict on its own (``tp.Checkpoint(history=[])``) cannot receive saved plain values: the
restore reports the unused ``py_state`` instead.

Any other value (an open file, a function, a set, a custom object) fails the save with an
:class:`~trackpoint.errors.InvalidArgumentError` naming it (``(root).extra['handle']``) and the
fixes: a ``tp.PythonState``, a ``tp.Variable``/array, removing it, or ``NoDependency``
(``SaveChecked`` lets the graph walk name the path). Entries assigned through ``NoDependency``
are neither saved nor checked.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from trackpoint.bundle.dtypes import datatype_for
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.state_json import dumps, loads

__all__ = [
    "decode_plain",
    "encode_plain",
    "entry_label",
    "find_unplain",
    "is_plain",
    "is_plain_key",
    "merge_plain",
    "short_repr",
    "type_name",
    "updates_by_index",
]

_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_DICTS = (dict, OrderedDict, defaultdict)


def _storable_scalar(value: np.generic) -> bool:
    if isinstance(value, (np.str_, np.bytes_)):
        return True
    if value.dtype.kind in "OSUVMm":
        return False
    try:
        datatype_for(value.dtype)
    except InvalidArgumentError:
        return False
    return True


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _is_plain_container(value: Any) -> bool:
    """A builtin list/tuple/dict, a namedtuple or an (ordered, default) dict; other subclasses
    may carry more than their items, so they are not plain."""
    kind = type(value)
    return kind is list or kind is tuple or kind in _DICTS or _is_namedtuple(value)


def is_plain(value: Any, seen: set[int] | None = None) -> bool:
    """True if ``value`` can be saved as JSON and restored as an equal value of its type.

    ``seen`` guards against containers holding themselves (those are not plain).
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is np.ndarray:  # the usual entry of a large state: a value, never plain
        return False
    if isinstance(value, np.generic):
        return _storable_scalar(value)
    if isinstance(value, Trackable):
        # A tracked container without trackables inside (containers.py) is plain.
        check = getattr(value, "_is_all_plain", None)
        return check is not None and bool(check(seen))
    if _is_plain_container(value):
        seen = set() if seen is None else seen
        if id(value) in seen:
            return False  # a cycle: JSON cannot hold it
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return all(
                    is_plain_key(k) and is_plain(v, seen) for k, v in value.items()
                )
            return all(is_plain(v, seen) for v in value)
        finally:
            seen.discard(id(value))
    return False


def is_plain_key(key: Any) -> bool:
    """True for a dict key JSON state can hold: a plain scalar or a tuple of them."""
    return type(key) in _SCALARS or (type(key) is tuple and all(is_plain_key(k) for k in key))


def entry_label(key: Any) -> str:
    """How an entry is written after its container's path: ``['epoch']``, ``[3]``."""
    return f"[{key!r}]"


def find_unplain(value: Any, label: str, seen: set[int] | None = None) -> tuple[str, Any]:
    """The first part of ``value`` (not plain) that is neither plain nor a container of plain
    values, with its label below ``label``: ``("['cfg'][1]", <object>)``."""
    seen = set() if seen is None else seen
    if isinstance(value, Trackable) or id(value) in seen:
        return label, value
    if _is_plain_container(value):
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and not is_plain_key(key):
                return f"{label} key {key!r}", key
            if not is_plain(item, seen):
                return find_unplain(item, label + entry_label(key), seen)
    return label, value


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 200 characters for messages."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def type_name(value: Any) -> str:
    """``value``'s type for messages: ``set``, ``_io.TextIOWrapper``."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def updates_by_index(
    saved: Any, items: list[tuple[Any, Any]], is_exempt: Callable[[Any, Any], bool], *, what: str
) -> dict[int, Any]:
    """``{index: saved value}`` from a list's or tuple's saved ``{"<index>": value}`` object.

    Raises:
        InvalidArgumentError: ``saved`` is not that object, or names an index the program's
            container lacks or holds a trackable (or NoDependency) element at.
    """
    if not isinstance(saved, dict):
        raise InvalidArgumentError(
            f"the checkpoint holds a {type(saved).__name__} as the plain values of a {what}, "
            "not a list or an object by index; was it written for another kind of container?"
        )
    updates: dict[int, Any] = {}
    for key, value in saved.items():
        index = int(key) if isinstance(key, str) and key.isdigit() else -1
        if index < 0 or index >= len(items):
            raise InvalidArgumentError(
                f"the checkpoint has the plain value {short_repr(value)} at index {key!r} of a "
                f"{what}, but the program's {what} has {len(items)} elements; build it with the "
                "saved length"
            )
        if is_exempt(*items[index]) or not is_plain(items[index][1]):
            raise InvalidArgumentError(
                f"the checkpoint has the plain value {short_repr(value)} at index {index} of a "
                f"{what}, but the program holds {short_repr(items[index][1])} there; a "
                "checkpointed plain value cannot replace a trackable object"
            )
        updates[index] = value
    return updates


def _to_raw(value: Any) -> Any:
    """``value`` with wrappers made builtins and numpy scalars made 0-d arrays (keeps dtypes)."""
    if isinstance(value, np.generic):
        if isinstance(value, np.str_):
            return str(value)
        if isinstance(value, np.bytes_):
            return bytes(value)
        return np.asarray(value)
    if type(value) is complex:
        return np.asarray(value)
    if isinstance(value, dict):
        return {k: _to_raw(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [_to_raw(v) for v in list.__iter__(value)]
    if isinstance(value, tuple):  # a TupleWrapper reports its wrapped type as __class__
        return tuple(_to_raw(v) for v in value)
    return value


def _from_raw(value: Any) -> Any:
    """Undo :func:`_to_raw`'s array form of numpy scalars (plain values hold no arrays)."""
    if isinstance(value, np.ndarray):
        return value[()] if value.ndim == 0 else value
    if isinstance(value, list):
        return [_from_raw(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_from_raw(v) for v in value)
    if isinstance(value, dict):
        return {k: _from_raw(v) for k, v in value.items()}
    return value


def encode_plain(value: Any, *, what: str) -> bytes:
    """``value`` (plain, see :func:`is_plain`) as strict JSON bytes."""
    return dumps(_to_raw(value), what=what)


def decode_plain(data: bytes, *, what: str) -> Any:
    """The value :func:`encode_plain` wrote (tuples as tuples, numpy scalars with their dtype).

    Raises:
        InvalidArgumentError: ``data`` is not JSON state.
    """
    return _from_raw(loads(data, what=what))


def merge_plain(live: Any, saved: Any) -> Any:
    """The value to hold after restoring ``saved`` where the program holds ``live`` (plain).

    Lists and dicts are refilled in place and returned (so references to them stay valid);
    a namedtuple is rebuilt with its own type; anything else is ``saved`` itself: the checkpoint
    records the saved value's type, and it wins over the live one's.
    """
    if isinstance(saved, list) and isinstance(live, list):
        current = list(list.__iter__(live))
        live[:] = [
            merge_plain(current[i], item) if i < len(current) else item
            for i, item in enumerate(saved)
        ]
        return live
    if isinstance(saved, dict) and isinstance(live, dict):
        for key in [k for k in dict.keys(live) if k not in saved]:
            del live[key]
        for key, item in saved.items():
            live[key] = merge_plain(dict.get(live, key), item)
        return live
    if isinstance(saved, tuple) and isinstance(live, tuple):
        items = list(live)
        merged = [
            merge_plain(items[i], item) if i < len(items) else item
            for i, item in enumerate(saved)
        ]
        kind = live.__class__  # a TupleWrapper's wrapped type
        if hasattr(kind, "_fields") and len(merged) == len(items):
            return kind(*merged)
        return tuple(merged)
    return saved
