"""Every name a saved value goes by, and object paths resolved against a saved graph.

A checkpoint stores each value once, under the key of the first path the save's breadth-first
walk reached its node by (tf-checkpoint-format.md §9.2). A node with several parents — a tied
weight such as torch's ``lm_head.weight = wte.weight``, one node under two modules — has more
names, and only the object graph knows them. ``module.state_dict()`` lists every one, so the
readers that produce state_dicts (``tp.torch.load_state_dict``, ``trackpoint convert``) and the
CLI's readable paths (``model.dense.kernel``) take them from here. Names are built with the
key grammar of :mod:`trackpoint.graph.keys`, never spelled anew.
"""

from __future__ import annotations

from dataclasses import dataclass

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.errors import NotFoundError
from trackpoint.graph.keys import (
    VARIABLE_VALUE_KEY,
    checkpoint_key,
    escape_local_name,
    split_checkpoint_key,
    unescape_local_name,
)

__all__ = ["ROOT_NAME", "ValuePath", "alias_keys", "resolve_object_path", "value_paths"]

ROOT_NAME = "(root)"
"""How readable paths name the root node (TF's messages: ``(root).model.dense.kernel``)."""


@dataclass(frozen=True, slots=True)
class ValuePath:
    """One path from a start node to a saved value."""

    key: str
    """The checkpoint key the value is stored under (the same for every path to it)."""
    path: tuple[str, ...]
    """Unescaped local names from the start node to the node holding the value."""
    attribute: str
    """The unescaped value name: ``VARIABLE_VALUE`` for a variable."""
    node_id: int
    """The node holding the value."""

    @property
    def object_path(self) -> str:
        """The escaped object path, ``model/dense/kernel``."""
        return "/".join(escape_local_name(name) for name in self.path)

    @property
    def alias_key(self) -> str:
        """The key this path spells; equals :attr:`key` for the path the save wrote it under."""
        return checkpoint_key(self.object_path, self.attribute)

    @property
    def name(self) -> str:
        """The state_dict name: local names joined by ``.``, ``.<attribute>`` unless a variable."""
        parts = self.path if self.attribute == VARIABLE_VALUE_KEY else (*self.path, self.attribute)
        return ".".join(parts)


def value_paths(graph: TrackableObjectGraph, *, start: int = 0) -> list[ValuePath]:
    """Every path from node ``start`` to a saved value, depth first in child order.

    Depth first in child order is the order ``torch.nn.Module.state_dict()`` lists names in, and
    a tied value comes once per path to it. A path that would revisit one of its own nodes
    stops there (graphs may have cycles). Slot variables hang off optimizers, not children, so
    they are not reached.
    """
    nodes = graph.nodes
    out: list[ValuePath] = []
    if not 0 <= start < len(nodes):
        return out
    stack: list[tuple[int, tuple[str, ...], tuple[int, ...]]] = [(start, (), (start,))]
    while stack:
        node_id, path, ancestors = stack.pop()
        node = nodes[node_id]
        for attribute in node.attributes:
            split = split_checkpoint_key(attribute.checkpoint_key)
            value_name = split[1] if split is not None else unescape_local_name(attribute.name)
            out.append(ValuePath(attribute.checkpoint_key, path, value_name, node_id))
        for child in reversed(node.children):
            if 0 <= child.node_id < len(nodes) and child.node_id not in ancestors:
                stack.append(
                    (child.node_id, (*path, child.local_name), (*ancestors, child.node_id))
                )
    return out


def alias_keys(graph: TrackableObjectGraph) -> dict[str, list[str]]:
    """``{stored key: [the keys of its other paths from the root]}`` for values with aliases."""
    aliases: dict[str, list[str]] = {}
    for value in value_paths(graph):
        spelled = value.alias_key
        if spelled != value.key:
            known = aliases.setdefault(value.key, [])
            if spelled not in known:
                known.append(spelled)
    return aliases


def _follow(graph: TrackableObjectGraph, names: tuple[str, ...]) -> int | None:
    node_id = 0
    for name in names:
        for child in graph.nodes[node_id].children:
            if child.local_name == name and 0 <= child.node_id < len(graph.nodes):
                node_id = child.node_id
                break
        else:
            return None
    return node_id


def _match_dotted(
    graph: TrackableObjectGraph, node_id: int, rest: str, names: tuple[str, ...]
) -> tuple[int, tuple[str, ...]] | None:
    """Split ``rest`` at dots into local names of a path from ``node_id`` (names may hold dots)."""
    for child in graph.nodes[node_id].children:
        name = child.local_name
        if not 0 <= child.node_id < len(graph.nodes) or not name:
            continue
        if rest == name:
            return child.node_id, (*names, name)
        if rest.startswith(name + "."):
            found = _match_dotted(graph, child.node_id, rest[len(name) + 1 :], (*names, name))
            if found is not None:
                return found
    return None


def resolve_object_path(graph: TrackableObjectGraph, path: str) -> tuple[int, tuple[str, ...]]:
    """The node an object path names, and its unescaped local names.

    Accepted: the escaped form of keys (``model/dense``), or the readable one
    (``model.dense``, ``(root).model.dense``; local names may contain dots); ``""`` and
    ``(root)`` are the root.

    Raises:
        NotFoundError: no node has that path.
    """
    nodes = graph.nodes
    text = path.strip()
    if text.startswith(ROOT_NAME):
        text = text[len(ROOT_NAME) :].lstrip(".")
    text = text.strip("/")
    if len(nodes):
        if not text:
            return 0, ()
        names = tuple(unescape_local_name(part) for part in text.split("/"))
        node_id = _follow(graph, names)
        if node_id is not None:
            return node_id, names
        found = _match_dotted(graph, 0, text, ())
        if found is not None:
            return found
    top = sorted({child.local_name for child in nodes[0].children}) if len(nodes) else []
    raise NotFoundError(
        f"no object at path {path!r} in the checkpoint's object graph; the root's children "
        f"are: {', '.join(top) or '(none)'}. Separate local names with '/' or '.' "
        "(`trackpoint objects PATH` lists every object path)",
        key=path,
    )
