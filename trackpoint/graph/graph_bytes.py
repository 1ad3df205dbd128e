"""The ``TrackableObjectGraph`` serialized by hand, as protobuf does it.

Fields in number order, empty strings and zero ints left out: building one protobuf message per
node, child and attribute costs more than the rest of a save of many small tensors.
tests/graph/test_graph_encoding.py pins the bytes against protobuf's own serialization.

:func:`encode_alike_leaves` writes many alike nodes at once — leaves whose class saves the same
value names — one pass per list instead of one call per node: the bulk of a large model.
"""

from __future__ import annotations

import operator
from itertools import chain, repeat

import numpy as np

from trackpoint.bundle.table import encode_varint
from trackpoint.bundle.table_batch import varint_bytes, varint_sizes

__all__ = [
    "HAS_VALUES",
    "attribute",
    "child_refs",
    "encode_alike_leaves",
    "encode_all",
    "field",
    "has_checkpoint_values",
    "name_field",
    "node",
    "slot_ref",
    "string",
]

HAS_VALUES = (b"\x2a\x00", b"\x2a\x02\x08\x01")  # BoolValue field 5: false / true
"""Field 5 (``has_checkpoint_values``) of a node, by its value."""

_SEPARATOR = "\x00"  # joins texts to encode them in one call
# The varints below 128 (one byte), looked up rather than encoded: most lengths are small.
_SMALL = [bytes([n]) for n in range(128)]


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (strings, sub-messages)."""
    return tag + encode_varint(len(payload)) + payload


def string(tag: bytes, text: str) -> bytes:
    """A string field; nothing for an empty string (proto3)."""
    return field(tag, text.encode("utf-8")) if text else b""


def _int(tag: bytes, value: int) -> bytes:
    return tag + encode_varint(value) if value else b""


def _varint(value: int) -> bytes:
    return _SMALL[value] if value < 128 else encode_varint(value)


def _child_ref(node_id: int, local_name: str) -> bytes:
    # Written out (no helper calls): one per edge of the graph.
    body = b"\x08" + encode_varint(node_id) if node_id else b""
    if local_name:
        name = local_name.encode("utf-8")
        size = len(name)
        body += b"\x12" + (_SMALL[size] if size < 128 else encode_varint(size)) + name
    size = len(body)
    return b"\x0a" + (_SMALL[size] if size < 128 else encode_varint(size)) + body


def name_field(name: str) -> bytes:
    """Field 1 (name) of a ``SerializedTensor``; the few value names recur, so callers keep it."""
    return string(b"\x0a", name)


def attribute(name_bytes: bytes, full_name: str, key: str) -> bytes:
    """Field 2 of a node: one ``SerializedTensor`` (``name_bytes`` from :func:`name_field`)."""
    # Written out (no helper calls): one per value of the checkpoint.
    body = name_bytes
    if full_name:
        data = full_name.encode("utf-8")
        body += b"\x12" + _varint(len(data)) + data
    if key:
        data = key.encode("utf-8")
        body += b"\x1a" + _varint(len(data)) + data
    return b"\x12" + _varint(len(body)) + body


def slot_ref(variable_id: int, slot_name: str, slot_id: int) -> bytes:
    """Field 3 of an optimizer's node: one ``SlotVariableReference``."""
    return field(
        b"\x1a", _int(b"\x08", variable_id) + string(b"\x12", slot_name) + _int(b"\x18", slot_id)
    )


def node(body: bytes, has_values: bool) -> bytes:
    """One ``TrackableObject`` as field 1 of the graph: its fields 1-4, then field 5."""
    return field(b"\x0a", body + HAS_VALUES[has_values])


def has_checkpoint_values(edges: list[list[int]], marked: list[bool]) -> list[bool]:
    """``marked`` (nodes with values, slots or a registered saver) spread to all ancestors.

    A node is set when one of its children is, until nothing changes; nodes are visited
    deepest first (breadth-first ids: children mostly after their parents), so a tree takes
    one pass, and only unset nodes with children are visited at all.
    """
    pending = [index for index, child_ids in enumerate(edges) if child_ids and not marked[index]]
    pending.reverse()
    changed = True
    while changed and pending:
        changed = False
        still = []
        for index in pending:
            if any(map(marked.__getitem__, edges[index])):
                marked[index] = changed = True
            else:
                still.append(index)
        pending = still
    return marked


def encode_all(texts: list[str]) -> list[bytes]:
    """Each of ``texts`` in UTF-8 (one encode call when no text holds the separator)."""
    joined = _SEPARATOR.join(texts)
    if joined.count(_SEPARATOR) != len(texts) - 1:
        return [text.encode("utf-8") for text in texts]
    return joined.encode("utf-8").split(_SEPARATOR.encode("utf-8"))


def child_refs(child_ids: list[int], local_names: list[str]) -> bytes:
    """Field 1 of a node: each child's ``ObjectReference``, in order (one pass per list for a
    node with many children)."""
    if len(child_ids) < 16 or 0 in child_ids or "" in local_names:
        return b"".join(map(_child_ref, child_ids, local_names))
    encoded = encode_all(local_names)
    sizes = list(map(len, encoded))
    ids = _varints(child_ids)
    body_sizes = list(map(operator.add, map(len, ids), map(operator.add, repeat(3), sizes)))
    if max(body_sizes) >= 128:  # long names: lengths of two bytes
        return b"".join(map(_child_ref, child_ids, local_names))
    small = _SMALL.__getitem__
    return b"".join(
        chain.from_iterable(
            zip(
                repeat(b"\x0a"), map(small, body_sizes), repeat(b"\x08"), ids,
                repeat(b"\x12"), map(small, sizes), encoded,
            )
        )
    )  # fmt: skip


def _varints(values: list[int]) -> list[bytes]:
    """``encode_varint`` of each of ``values`` (non-negative), in one numpy pass."""
    array = np.fromiter(values, np.int64, len(values))
    sizes = varint_sizes(array)
    width = int(sizes.max()) if len(values) else 1
    data = varint_bytes(array, sizes, width).tobytes()
    starts = np.arange(0, len(values) * width, width)
    return list(map(data.__getitem__, map(slice, starts.tolist(), (starts + sizes).tolist())))


def encode_alike_leaves(
    escaped_names: tuple[str, ...], keys: list[list[str]], full_names: list[str] | None
) -> list[bytes]:
    """The whole node of each of many leaves that save the same values: what :func:`node` of
    the attributes :func:`attribute` writes gives, ``has_checkpoint_values`` true.

    Args:
        escaped_names: the value names, escaped (each node's attributes, in order).
        keys: ``keys[j][i]``, the checkpoint key of value ``j`` of node ``i``.
        full_names: each node's ``full_name`` (a variable's name), or None for none.
    """
    count = len(keys[0])
    # Fields 1 and 2 (name, full_name) of each SerializedTensor, per distinct full name.
    distinct = set(full_names) if full_names is not None else {""}
    attributes: list[list[bytes]] = []
    for escaped, keys_of_value in zip(escaped_names, keys):
        name_bytes = name_field(escaped)
        heads: dict[str, bytes] = {}
        for full_name in distinct:
            data = full_name.encode("utf-8")
            heads[full_name] = name_bytes + (b"\x12" + _varint(len(data)) + data if data else b"")
        head_of = list(map(heads.__getitem__, full_names)) if full_names is not None else (
            [heads[""]] * count
        )
        encoded = encode_all(keys_of_value)
        sizes = list(map(len, encoded))
        # Everything before the key's bytes, per distinct (head, key size): a few in all.
        before: dict[tuple[bytes, int], bytes] = {}
        for head, size in set(zip(head_of, sizes)):
            body_size = len(head) + 1 + len(_varint(size)) + size  # the SerializedTensor
            before[head, size] = b"\x12" + _varint(body_size) + head + b"\x1a" + _varint(size)
        starts = map(before.__getitem__, zip(head_of, sizes))
        attributes.append(list(map(operator.add, starts, encoded)))
    bodies = attributes[0] if len(attributes) == 1 else list(map(b"".join, zip(*attributes)))
    sizes = list(map(len, bodies))
    heads_by_size = {size: b"\x0a" + _varint(size + len(HAS_VALUES[True])) for size in set(sizes)}
    starts = map(heads_by_size.__getitem__, sizes)
    return list(map(operator.add, map(operator.add, starts, bodies), repeat(HAS_VALUES[True])))
