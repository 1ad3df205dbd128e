"""Names the CLI shows and accepts: readable object paths, and the module a value belongs to.

A checkpoint key (``model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE``) is exact but long; people
type ``model.dense.kernel``. :func:`resolve_key` accepts every spelling the CLI prints and turns
it into the key, through the key grammar of :mod:`trackpoint.graph.keys` and the object graph's
names (:mod:`trackpoint.graph.aliases`, tied weights included).
"""

from __future__ import annotations

import difflib

from trackpoint.errors import NotFoundError
from trackpoint.graph.aliases import ROOT_NAME, value_paths
from trackpoint.graph.keys import OPTIMIZER_SLOTS_NAME, split_checkpoint_key, variable_key
from trackpoint.management.reader import CheckpointReader

__all__ = ["ROOT_MODULE", "module_of", "readable_names", "resolve_key"]

ROOT_MODULE = ROOT_NAME
"""The module of values held by the root itself, and of keys outside the grammar."""


def module_of(key: str, depth: int | None = None) -> str:
    """The readable path of the object that owns the value at ``key``: ``model.dense`` for
    ``model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE``, at most ``depth`` names deep.

    A slot variable belongs to its optimizer; keys outside the grammar (the object graph, TF1
    names) to :data:`ROOT_MODULE`.
    """
    split = split_checkpoint_key(key)
    if split is None:
        return ROOT_MODULE
    path = split[0]
    if OPTIMIZER_SLOTS_NAME in path:
        marker = path.index(OPTIMIZER_SLOTS_NAME)
        owner = path[marker + 1 : -1]  # variable / .OPTIMIZER_SLOT / optimizer... / slot name
    else:
        owner = path[:-1]
    if depth is not None:
        owner = owner[:depth]
    return ".".join(owner) if owner else ROOT_MODULE


def readable_names(reader: CheckpointReader) -> dict[str, str]:
    """``{readable name: checkpoint key}`` for every path to a value (tied weights too)."""
    graph = reader.object_graph()
    names: dict[str, str] = {}
    if graph is None:
        return names
    for value in value_paths(graph):
        names.setdefault(value.name, value.key)
    return names


def resolve_key(reader: CheckpointReader, text: str) -> str:
    """The checkpoint key ``text`` names.

    Tried in order: an exact key; an object path whose variable value is meant
    (``model/dense/kernel``); a readable path (``model.dense.kernel``, ``(root).model.dense.
    kernel``, a tied weight's other name, ``model.rng.state`` for a value that is not a
    variable's).

    Raises:
        NotFoundError: nothing matches; the message suggests close names.
    """
    if reader.has_tensor(text):
        return text
    as_variable = variable_key(text.strip("/"))
    if reader.has_tensor(as_variable):
        return as_variable
    names = readable_names(reader)
    readable = text[len(ROOT_NAME) :].lstrip(".") if text.startswith(ROOT_NAME) else text
    if readable in names:
        return names[readable]
    close = difflib.get_close_matches(readable, [*names, *reader.keys()], n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise NotFoundError(
        f"no value named {text!r} in checkpoint {reader.prefix}.{hint} Give a checkpoint key "
        "(`trackpoint ls PATH`) or an object path such as model.dense.kernel "
        "(`trackpoint objects PATH`)",
        path=reader.prefix,
        key=text,
    )
