"""The checkpoint-key grammar: its constants and the functions that build and split keys.

A value's key is ``<object path>/.ATTRIBUTES/<escaped value name>`` where the object path joins
escaped local names with ``/`` (tf-checkpoint-format.md §9.3). Local names are escaped ``.`` →
``..`` first, then ``/`` → ``.S``. Every other module takes these spellings from here, so a
key built on save and a key parsed on restore or by the converter can never disagree.
"""

from __future__ import annotations

from trackpoint.tracking.base import VARIABLE_VALUE_KEY

__all__ = [
    "ADVISORY_ATTRIBUTES",
    "ATTRIBUTES",
    "JAX_METADATA",
    "OBJECT_ATTRIBUTES_NAME",
    "OBJECT_GRAPH_KEY",
    "OPTIMIZER_SLOTS_NAME",
    "SAVE_COUNTER",
    "VARIABLE_VALUE_KEY",
    "checkpoint_key",
    "escape_local_name",
    "local_name",
    "slot_variable_key",
    "split_checkpoint_key",
    "unescape_local_name",
    "variable_key",
]

_ESCAPE = "."
OBJECT_ATTRIBUTES_NAME = ".ATTRIBUTES"
"""The path segment between an object's path and its value names."""
ATTRIBUTES = f"/{OBJECT_ATTRIBUTES_NAME}/"
"""``/.ATTRIBUTES/`` as it appears inside a key (the leading ``/`` matters, see local_name)."""
OPTIMIZER_SLOTS_NAME = ".OPTIMIZER_SLOT"
"""The path segment of a slot variable between its variable's and its optimizer's paths."""
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
"""The key of the serialized ``TrackableObjectGraph`` (a scalar DT_STRING value)."""
SAVE_COUNTER = "save_counter"
"""Local name of the int64 variable that numbers ``Checkpoint.save()`` calls."""
JAX_METADATA = "jax_metadata"
"""Attribute of a JAX array's node: JSON naming its PRNG key implementation or ``weak_type``."""
ADVISORY_ATTRIBUTES = frozenset({JAX_METADATA})
"""Attribute names that describe a value rather than hold state (``jax_metadata``: a JAX PRNG
key's implementation, an array's ``weak_type``). An object that cannot use one loses nothing,
so a restore does not report it as unused."""


def escape_local_name(name: str) -> str:
    """Escape a local name for use in a key: ``.`` → ``..`` first, then ``/`` → ``.S``."""
    return name.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace("/", _ESCAPE + "S")


def unescape_local_name(escaped: str) -> str:
    """Undo :func:`escape_local_name`: ``..`` → ``.``, ``.S`` → ``/`` (format §9.3)."""
    out = []
    i = 0
    while i < len(escaped):
        pair = escaped[i : i + 2]
        if pair == "..":
            out.append(".")
            i += 2
        elif pair == ".S":
            out.append("/")
            i += 2
        else:
            out.append(escaped[i])
            i += 1
    return "".join(out)


def checkpoint_key(object_path: str, value_name: str) -> str:
    """``<object path>/.ATTRIBUTES/<escaped value name>`` (the root's path is empty)."""
    return f"{object_path}{ATTRIBUTES}{escape_local_name(value_name)}"


def variable_key(object_path: str) -> str:
    """The key of a variable's value: ``<object path>/.ATTRIBUTES/VARIABLE_VALUE``."""
    return f"{object_path}{ATTRIBUTES}{VARIABLE_VALUE_KEY}"


def slot_variable_key(variable_path: str, optimizer_path: str, slot_name: str) -> str:
    """The object path of a slot variable (its value key adds ``/.ATTRIBUTES/VARIABLE_VALUE``)."""
    return (
        f"{variable_path}/{OPTIMIZER_SLOTS_NAME}/{optimizer_path}/"
        f"{escape_local_name(slot_name)}"
    )


def local_name(key: str) -> str:
    """The attribute name in ``key``: the part after ``/.ATTRIBUTES/``.

    A key without that segment (TF1 name-based keys) is returned whole. Searching for the
    leading ``/`` too keeps an escaped child named ``.ATTRIBUTES`` (``..ATTRIBUTES``) from
    matching, which TF's own ``extract_local_name`` gets wrong.
    """
    index = key.find(ATTRIBUTES)
    return key if index < 0 else key[index + len(ATTRIBUTES) :]


def split_checkpoint_key(key: str) -> tuple[tuple[str, ...], str] | None:
    """``(local names, attribute name)`` of ``<path>/.ATTRIBUTES/<name>``, unescaped; None for
    keys without the attributes segment (TF1 names, the object graph)."""
    index = key.find(ATTRIBUTES)
    if index < 0:
        return None
    path = key[:index]
    parts = tuple(unescape_local_name(p) for p in path.split("/")) if path else ()
    return parts, unescape_local_name(key[index + len(ATTRIBUTES) :])
