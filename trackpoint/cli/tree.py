"""``trackpoint tree PATH``: the object graph as a tree, each object with the bytes under it.

Each node sits under the parent through which the save's breadth-first walk first reached it
(the path its keys carry, tf-checkpoint-format.md §9.2). A node reached again by another path
(a tied weight) appears there as a reference to its first path, never counted twice. An
optimizer's slot variables are listed under the optimizer. A checkpoint without an object
graph (TF1 names) is shown as the tree of its keys split at ``/``.
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import dataclass, field

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from trackpoint.bundle import BundleReader
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.cli.output import Output
from trackpoint.cli.progress import human_bytes
from trackpoint.graph.aliases import ROOT_NAME
from trackpoint.graph.keys import VARIABLE_VALUE_KEY, split_checkpoint_key
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader

__all__ = [
    "ObjectNode",
    "ValueInfo",
    "add_parser",
    "build_object_tree",
    "cmd_tree",
    "render_plain",
    "render_rich",
]


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """One saved value of an object."""

    name: str
    """The value name (``VARIABLE_VALUE`` for a variable)."""
    key: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int


@dataclass(slots=True)
class ObjectNode:
    """One object of the tree (built once, then only read)."""

    name: str
    """Its local name under its parent (``(root)`` for the root)."""
    path: str
    """Readable path from the root: ``model.dense.kernel``; ``""`` for the root."""
    values: list[ValueInfo] = field(default_factory=list)
    children: list[ObjectNode] = field(default_factory=list)
    alias_of: str | None = None
    """For a node reached again: the readable path it was first reached by."""
    bytes: int = 0
    """Stored bytes of its values and of everything listed under it (aliases count 0)."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name, "path": self.path, "bytes": self.bytes,
            "alias_of": self.alias_of,
            "values": [{"name": v.name, "key": v.key, "dtype": v.dtype, "shape": list(v.shape),
                        "bytes": v.bytes} for v in self.values],
            "children": [child.to_json() for child in self.children],
        }  # fmt: skip


def _value(reader: BundleReader, name: str, key: str) -> ValueInfo:
    if not reader.has_tensor(key):  # a registered saver's value lives elsewhere
        return ValueInfo(name, key, "-", (), 0)
    dtype = "string" if reader.dtype(key).kind == "O" else str(reader.dtype(key))
    return ValueInfo(name, key, dtype, tuple(reader.shape(key)), reader.stored_bytes(key))


def _first_edges(graph: TrackableObjectGraph) -> dict[int, tuple[int, int]]:
    """node id -> (parent id, child index) of the breadth-first walk's first edge to it."""
    first: dict[int, tuple[int, int]] = {0: (-1, -1)}
    queue = collections.deque([0])
    while queue:
        node_id = queue.popleft()
        for index, child in enumerate(graph.nodes[node_id].children):
            if child.node_id not in first and 0 <= child.node_id < len(graph.nodes):
                first[child.node_id] = (node_id, index)
                queue.append(child.node_id)
    return first


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _from_graph(reader: BundleReader, graph: TrackableObjectGraph) -> ObjectNode:
    first = _first_edges(graph)
    paths: dict[int, str] = {}
    for node_id, (parent, index) in first.items():  # breadth-first order: parents come first
        name = graph.nodes[parent].children[index].local_name if parent >= 0 else ""
        paths[node_id] = _join(paths[parent], name) if parent >= 0 else ""
    root = ObjectNode(ROOT_NAME, "")
    pending = collections.deque([(0, root)])
    aliases: list[tuple[ObjectNode, int]] = []  # named once every first path is known
    while pending:
        node_id, node = pending.popleft()
        proto = graph.nodes[node_id]
        for attribute in proto.attributes:
            split = split_checkpoint_key(attribute.checkpoint_key)
            name = split[1] if split is not None else attribute.name
            node.values.append(_value(reader, name, attribute.checkpoint_key))
        for index, ref in enumerate(proto.children):
            if not 0 <= ref.node_id < len(graph.nodes):
                continue
            child = ObjectNode(ref.local_name, _join(node.path, ref.local_name))
            if first.get(ref.node_id) == (node_id, index):
                pending.append((ref.node_id, child))
            else:
                aliases.append((child, ref.node_id))
            node.children.append(child)
        for slot in proto.slot_variables:
            name = f"{slot.slot_name} of {paths.get(slot.original_variable_node_id, '?')}"
            child = ObjectNode(name, _join(node.path, slot.slot_name))
            slot_id = slot.slot_variable_node_id
            if 0 <= slot_id < len(graph.nodes) and slot_id not in first and slot_id not in paths:
                paths[slot_id] = child.path
                pending.append((slot_id, child))
            node.children.append(child)
    for child, target in aliases:
        child.alias_of = paths.get(target, f"<node {target}>") or ROOT_NAME
    _add_bytes(root)
    return root


def _from_keys(reader: BundleReader) -> ObjectNode:
    """The tree of a checkpoint without an object graph: its keys split at ``/``."""
    root = ObjectNode(ROOT_NAME, "")
    for key in reader.keys():
        node = root
        parts = key.split("/")
        for part in parts[:-1]:
            found = next((c for c in node.children if c.name == part), None)
            if found is None:
                found = ObjectNode(part, _join(node.path, part))
                node.children.append(found)
            node = found
        node.values.append(_value(reader, parts[-1], key))
    _add_bytes(root)
    return root


def _add_bytes(root: ObjectNode) -> None:
    """Fill in every node's total, children before parents (no recursion: graphs go deep)."""
    stack, order = [root], []
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children)
    for node in reversed(order):
        node.bytes = sum(v.bytes for v in node.values) + sum(c.bytes for c in node.children)


def build_object_tree(reader: CheckpointReader) -> ObjectNode:
    """The checkpoint's objects as a tree with byte totals (see the module docstring).

    Raises:
        DataLossError: the object graph is damaged.
    """
    graph = reader.object_graph()
    return _from_keys(reader.bundle) if graph is None else _from_graph(reader.bundle, graph)


def _label(node: ObjectNode) -> str:
    if node.alias_of is not None:
        return f"{node.name} -> same object as {node.alias_of}"
    if len(node.values) == 1 and not node.children and node.values[0].name == VARIABLE_VALUE_KEY:
        value = node.values[0]
        shape = "[" + ", ".join(map(str, value.shape)) + "]"
        return f"{node.name}  {value.dtype} {shape}  {human_bytes(value.bytes)}"
    return f"{node.name}  ({human_bytes(node.bytes)})"


def _value_lines(node: ObjectNode) -> list[str]:
    if len(node.values) == 1 and not node.children and node.values[0].name == VARIABLE_VALUE_KEY:
        return []  # shown on the node's own line
    return [
        f".{v.name}  {v.dtype} [{', '.join(map(str, v.shape))}]  {human_bytes(v.bytes)}"
        for v in node.values
    ]


def render_plain(root: ObjectNode, depth: int | None) -> list[str]:
    """The tree as indented lines, two spaces per level."""
    lines: list[str] = []
    stack: list[tuple[ObjectNode, int]] = [(root, 0)]
    while stack:
        node, level = stack.pop()
        lines.append("  " * level + _label(node))
        if depth is not None and level >= depth:
            continue
        lines.extend("  " * (level + 1) + line for line in _value_lines(node))
        stack.extend((child, level + 1) for child in reversed(node.children))
    return lines


def render_rich(root: ObjectNode, depth: int | None) -> Tree:
    """The tree for a terminal (alias references dimmed)."""
    top = Tree(Text(_label(root)), highlight=False)
    stack: list[tuple[ObjectNode, Tree, int]] = [(root, top, 0)]
    while stack:
        node, branch, level = stack.pop()
        if depth is not None and level >= depth:
            continue
        for line in _value_lines(node):
            branch.add(Text(line), style="cyan")
        for child in node.children:
            style = "dim" if child.alias_of is not None else ""
            stack.append((child, branch.add(Text(_label(child)), style=style), level + 1))
    return top


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tree`` to ``trackpoint``'s subcommands."""
    p = subparsers.add_parser(
        "tree", help="the object graph as a tree, with the bytes under each object"
    )
    p.add_argument("path", help="checkpoint prefix, one of its files, or a directory")
    p.add_argument("--depth", type=int, default=None, metavar="N", help="show N levels")
    p.add_argument("--json", action="store_true", help="print the tree as nested JSON")
    p.set_defaults(func=cmd_tree)


def cmd_tree(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint tree``."""
    out = Output(console, json=args.json)
    location = resolve_location(args.path)
    with CheckpointReader(location.prefix, storage=location.storage) as reader:
        root = build_object_tree(reader)
    if out.json_mode:
        out.json(root.to_json())
    elif out.rich:
        console.print(render_rich(root, args.depth))
    else:
        for line in render_plain(root, args.depth):
            out.text(line)
    return 0
