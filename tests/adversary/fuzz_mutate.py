"""Mutators of real checkpoints' files, for the structured fuzzer (``fuzzer.py``).

A checkpoint is held as :class:`Files` (the index, the data files and the state file, as
bytes). A mutation is a list of :class:`Op` s: each names what it does (its ``desc`` is the
reproduction a finding prints), applies to :class:`Files` deterministically, and says whether
it may produce a checkpoint that is *valid but different* (``semantic``: a reshape that keeps
the byte size, a swapped key, a rewritten in-range node id), for which no reader can be asked
to notice. Structured ops decode what they change and encode it again with valid checksums
(the table's block CRCs, a rewritten string value's CRC), so the change reaches the code
behind the checksums; raw ops flip, cut and extend bytes.

``fuzz_ops.generate`` draws 1-3 ops for one case from a seeded ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from trackpoint.bundle.entries import make_entry
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.strings import encode_strings
from trackpoint.bundle.table import read_table
from trackpoint.bundle.table_batch import table_of_pairs

__all__ = ["Files", "Op", "Skip"]

GRAPH_KEY = b"_CHECKPOINTABLE_OBJECT_GRAPH"
DT_STRING = 7
HUGE_IDS = [-1, -2, -(2**31), 2**31 - 1, 2**20]
HUGE_DIMS = [2**31, 2**40, 2**50, 2**61, 2**62 - 1, 2**63 - 1, -1, -(2**40)]


@dataclass
class Files:
    """One checkpoint's files as bytes: ``data`` by file-name suffix (``.data-00000-of-00001``)."""

    index: bytes
    data: dict[str, bytes]
    state: bytes | None
    rewritten: frozenset[str] = frozenset()  # keys whose value an op replaced on purpose
    hostile: frozenset[str] = frozenset()  # keys whose value no read may return

    def copy(self) -> Files:
        return Files(self.index, dict(self.data), self.state, self.rewritten, self.hostile)


@dataclass
class Op:
    desc: str
    apply: Callable[[Files], None]
    semantic: bool = False
    tags: list[str] = field(default_factory=list)


class Skip(Exception):
    """An op that no longer applies (an earlier op removed what it changes)."""


# -- structured access -----------------------------------------------------------------------
def entries(files: Files) -> list[tuple[bytes, bytes]]:
    try:
        return read_table(files.index, "fuzz.index").pairs()
    except Exception as exc:  # damaged by an earlier raw op
        raise Skip from exc


def set_entries(files: Files, rows: list[tuple[bytes, bytes]]) -> None:
    unique: dict[bytes, bytes] = {}
    for key, value in sorted(rows, key=lambda row: row[0]):
        unique.setdefault(key, value)
    files.index = table_of_pairs(list(unique.items()))


def _first_data(files: Files) -> str:
    return sorted(files.data)[0]


def read_string_value(files: Files, key: bytes) -> bytes:
    """The bytes of the scalar string ``key`` (no checksum checks: the pristine file's)."""
    rows = dict(entries(files))
    if key not in rows:
        raise Skip
    entry = BundleEntryProto.FromString(rows[key])
    data = files.data.get(sorted(files.data)[entry.shard_id] if entry.shard_id < len(files.data)
                          else "", b"")
    raw = data[entry.offset : entry.offset + entry.size]
    length, pos = 0, 0
    shift = 0
    while pos < len(raw):
        byte = raw[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            break
    start = pos + 4
    if start + length > len(raw):
        raise Skip
    return raw[start : start + length]


def write_string_value(files: Files, key: bytes, value: bytes) -> None:
    """Store ``value`` as the scalar string ``key``: appended to the first data file, the
    entry pointing at it with a valid checksum (so only the value itself is hostile)."""
    rows = dict(entries(files))
    name = _first_data(files)
    encoded = encode_strings([value])
    offset = len(files.data[name])
    files.data[name] += encoded.header + encoded.payload
    entry = make_entry(DT_STRING, (), shard_id=0, offset=offset, size=encoded.size,
                       crc32c=encoded.masked_crc)
    rows[key] = entry.SerializeToString()
    set_entries(files, list(rows.items()))
    files.rewritten |= {key.decode("utf-8", "surrogateescape")}
    files.hostile -= {key.decode("utf-8", "surrogateescape")}


def graph(files: Files) -> TrackableObjectGraph:
    try:
        return TrackableObjectGraph.FromString(read_string_value(files, GRAPH_KEY))
    except Skip:
        raise
    except Exception as exc:
        raise Skip from exc


def set_graph(files: Files, proto: TrackableObjectGraph) -> None:
    write_string_value(files, GRAPH_KEY, proto.SerializeToString())


def edit_entry(files: Files, key: bytes, change: Callable[[BundleEntryProto], None]) -> None:
    rows = dict(entries(files))
    if key not in rows:
        raise Skip
    entry = BundleEntryProto()
    try:
        entry.ParseFromString(rows[key])
    except Exception as exc:
        raise Skip from exc
    change(entry)
    rows[key] = entry.SerializeToString()
    set_entries(files, list(rows.items()))


# -- op generators -----------------------------------------------------------------------------
Info = dict  # facts about the pristine checkpoint: keys, node count, slot nodes, py_state keys


def _id_value(rng: random.Random, nodes: int) -> tuple[int, bool]:
    """A node id to write: out of range (must be refused) or in range (semantic)."""
    if rng.random() < 0.7:
        return rng.choice([*HUGE_IDS, nodes, nodes + 1, -nodes]), False
    return rng.randrange(max(nodes, 1)), True


def _graph_op(rng: random.Random, info: Info) -> Op:
    nodes = info["nodes"]
    kind = rng.choice(["child_id", "child_id", "slot_id", "slot_id", "optimizer_id", "drop_child",
                       "dup_child", "local_name", "attr_key", "attr_name", "dup_node",
                       "drop_node", "self_loop", "move_attrs", "registered_saver",
                       "clear_nodes", "graph_bytes"])
    target = rng.randrange(max(nodes, 1))
    value, in_range = _id_value(rng, nodes)
    pick = rng.random()
    text = rng.choice(["", "..", "VARIABLE_VALUE", "x/.ATTRIBUTES/VARIABLE_VALUE", "\x00",
                       "py_state", "a" * 300])
    if kind == "graph_bytes":
        pos, bit = rng.randrange(1 << 20), rng.randrange(8)

        def flip(files: Files) -> None:
            data = bytearray(read_string_value(files, GRAPH_KEY))
            if not data:
                raise Skip
            data[pos % len(data)] ^= 1 << bit
            write_string_value(files, GRAPH_KEY, bytes(data))

        return Op(f"graph bytes: flip bit {bit} of byte {pos} (mod len)", flip, True, ["graph"])

    def change(files: Files) -> None:
        proto = graph(files)
        count = len(proto.nodes)
        if not count:
            raise Skip
        node = proto.nodes[target % count]
        if kind == "child_id":
            if not node.children:
                raise Skip
            node.children[int(pick * len(node.children))].node_id = value
        elif kind == "slot_id" or kind == "optimizer_id":
            owners = [n for n in proto.nodes if n.slot_variables]
            if not owners:
                raise Skip
            owner = owners[int(pick * len(owners))]
            slot = owner.slot_variables[int(pick * 7919) % len(owner.slot_variables)]
            if kind == "slot_id":
                if int(pick * 1000) % 2:
                    slot.slot_variable_node_id = value
                else:
                    slot.original_variable_node_id = value
            else:  # a slot reference made to point at the optimizer itself or elsewhere
                slot.slot_variable_node_id = value if not in_range else 0
        elif kind == "drop_child":
            if not node.children:
                raise Skip
            del node.children[int(pick * len(node.children))]
        elif kind == "dup_child":
            if not node.children:
                raise Skip
            copy = node.children.add()
            copy.CopyFrom(node.children[int(pick * (len(node.children) - 1))])
        elif kind == "local_name":
            if not node.children:
                raise Skip
            node.children[int(pick * len(node.children))].local_name = text
        elif kind == "attr_key" or kind == "attr_name":
            if not node.attributes:
                raise Skip
            attribute = node.attributes[int(pick * len(node.attributes))]
            if kind == "attr_key":
                attribute.checkpoint_key = text
            else:
                attribute.name = text
        elif kind == "dup_node":
            proto.nodes.add().CopyFrom(node)
        elif kind == "drop_node":
            del proto.nodes[-1]
        elif kind == "self_loop":
            child = node.children.add()
            child.node_id = target % count
            child.local_name = "loop"
        elif kind == "move_attrs":
            other = proto.nodes[(target + 1 + int(pick * count)) % count]
            if other is node or (target + 1 + int(pick * count)) % count == target % count:
                raise Skip
            node.attributes.extend(list(other.attributes))
            del other.attributes[:]
        elif kind == "registered_saver":
            node.registered_saver.name = text or "tf.keras.optimizer"
            node.registered_saver.object_name = "x"
        elif kind == "clear_nodes":
            del proto.nodes[:]
        set_graph(files, proto)

    semantic = in_range or kind not in ("child_id", "slot_id", "optimizer_id")
    return Op(f"graph: {kind} on node {target} (mod n) value {value} pick {pick:.3f} "
              f"text {text[:20]!r}", change, semantic, ["graph"])


def _entry_op(rng: random.Random, info: Info) -> Op:
    keys: list[bytes] = info["entry_keys"]
    key = rng.choice(keys)
    kind = rng.choice(["shape", "shape", "slices", "slices", "offset", "size", "dtype", "shard",
                       "crc", "unknown_rank", "add_dim", "drop_dim"])
    value = rng.choice(HUGE_DIMS + [0, 1, 2, 3, 7])
    number = rng.choice([-1, 0, 1, 3, 2**31 - 1, 2**40, 2**62, -(2**62), rng.randrange(1 << 32)])
    pick = rng.random()

    def change(entry: BundleEntryProto) -> None:
        if kind == "shape":
            if not entry.shape.dim:
                raise Skip
            entry.shape.dim[int(pick * len(entry.shape.dim))].size = value
        elif kind == "add_dim":
            entry.shape.dim.add(size=value)
        elif kind == "drop_dim":
            if not entry.shape.dim:
                raise Skip
            del entry.shape.dim[-1]
        elif kind == "unknown_rank":
            entry.shape.unknown_rank = True
        elif kind == "slices":
            if entry.slices and pick < 0.5:
                extent = entry.slices[0].extent
                if not extent:
                    raise Skip
                chosen = extent[int(pick * 2 * len(extent)) % len(extent)]
                if pick < 0.25:
                    chosen.start = value if value >= 0 else 2**40
                else:
                    chosen.length = value if value >= 0 else 2**40
            else:
                added = entry.slices.add()
                for _ in range(len(entry.shape.dim)):
                    extent = added.extent.add()
                    if pick < 0.7:
                        extent.start = 0
                        extent.length = abs(value) % (1 << 62)
                if pick < 0.2:
                    entry.shape.dim.add(size=2**40)  # a huge partitioned tensor
        elif kind == "offset":
            entry.offset = number
        elif kind == "size":
            entry.size = number
        elif kind == "dtype":
            entry.dtype = rng_dtype  # type: ignore[assignment]
        elif kind == "shard":
            entry.shard_id = number if number < 2**31 else 2**31 - 1
        elif kind == "crc":
            entry.crc32c = number % (1 << 32)

    rng_dtype = rng.choice([0, 1, 2, 3, 5, 7, 9, 10, 14, 19, 20, 21, 23, 30, 200, 1000])
    # A reshape or retype that keeps the byte size makes a valid file with other values.
    semantic = kind in ("shape", "dtype", "add_dim", "drop_dim") or (
        kind == "slices" and value in (0, 1, 2, 3, 7))
    return Op(f"entry {key.decode('utf-8', 'replace')!r}: {kind} value {value} number {number} "
              f"dtype {rng_dtype} pick {pick:.3f}",
              lambda files: edit_entry(files, key, change), semantic, ["entry"])


def _header_op(rng: random.Random, info: Info) -> Op:
    kind = rng.choice(["num_shards", "endianness", "min_consumer", "bad_consumers", "producer",
                       "garbage"])
    number = rng.choice([-1, 0, 2, 3, 2**31 - 1, 2**20])

    def change(files: Files) -> None:
        rows = dict(entries(files))
        header = BundleHeaderProto()
        header.ParseFromString(rows.get(b"", b""))
        if kind == "num_shards":
            header.num_shards = number
        elif kind == "endianness":
            header.endianness = rng_end  # type: ignore[assignment]
        elif kind == "min_consumer":
            header.version.min_consumer = number
        elif kind == "bad_consumers":
            header.version.bad_consumers.append(1)
        elif kind == "producer":
            header.version.producer = number
        rows[b""] = header.SerializeToString() if kind != "garbage" else b"\xff\x01\x02"
        set_entries(files, list(rows.items()))

    rng_end = rng.choice([1, 2, 7])
    semantic = kind in ("endianness", "producer", "min_consumer") or (
        kind == "num_shards" and number == 1)
    return Op(f"header: {kind} number {number} endianness {rng_end}", change, semantic,
              ["header"])


def _table_op(rng: random.Random, info: Info) -> Op:
    keys: list[bytes] = info["entry_keys"]
    key = rng.choice(keys)
    other = rng.choice(keys)
    kind = rng.choice(["delete", "rename", "swap", "junk", "copy"])

    def change(files: Files) -> None:
        rows = dict(entries(files))
        if key not in rows:
            raise Skip
        if kind == "delete":
            del rows[key]
        elif kind == "rename":
            rows[key + b"x"] = rows.pop(key)
        elif kind == "swap":
            if other not in rows:
                raise Skip
            rows[key], rows[other] = rows[other], rows[key]
        elif kind == "junk":
            rows[key] = bytes([0x08, 0x01, 0x12, 0x05, 0x12, 0x03, 0x08, 0xFF, 0x7F])
        elif kind == "copy":
            rows[other] = rows[key]
        set_entries(files, list(rows.items()))
        # Entries moved between keys: a hostile value may now sit under another name.
        files.hostile -= {k.decode("utf-8", "surrogateescape") for k in (key, other)}

    semantic = kind in ("swap", "copy", "delete", "rename")
    return Op(f"table: {kind} {key!r} {other!r}", change, semantic, ["table"])


HOSTILE_JSON = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"9" * 100_000,
    b'{"epoch": ' + b"7" * 5000 + b"}",
    b"[" * 900 + b"]" * 900,
    b'{"__tuple__": 5}',
    b'{"__dict__": [[1]]}',
    b'{"__dict__": [[{"a": 1}, 2]]}',
    b'{"__dict__": 3}',
    b'{"__bytes__": "!!!"}',
    b'{"__bytes__": 7}',
    b'{"__float__": "huge"}',
    b'{"__ndarray__": {"dtype": "<f4", "shape": [1099511627776], "data": ""}}',
    b'{"__ndarray__": {"dtype": "V8", "shape": [1], "data": "AAAAAAAAAAA="}}',
    b'{"__ndarray__": {"dtype": "(1000000000,)f8", "shape": [], "data": ""}}',
    b'{"__ndarray__": 1}',
    b'{"__tensor__": {"x": 1}}',
    b'{"__tensor__": 1}',
    b"\xff\xfe",
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"NaN",
    b'{"epoch": 1e999}',
]


UNDECODABLE_JSON = HOSTILE_JSON[:5] + [b"\xff\xfe", b""]


def _state_value_op(rng: random.Random, info: Info) -> Op:
    keys: list[bytes] = info["py_state_keys"] or [GRAPH_KEY]
    key = rng.choice(keys)
    value = rng.choice(HOSTILE_JSON)
    # Valid JSON within the limits may be state a lenient owner accepts (a scheduler's
    # state_dict takes any keys): only the undecodable values must be refused.
    semantic = value not in UNDECODABLE_JSON
    return Op(f"py_state {key!r} := {value[:40]!r}... ({len(value)} bytes)",
              lambda files: write_string_value(files, key, value), semantic, ["json"])


def _raw_op(rng: random.Random, info: Info) -> Op:
    target = rng.choice(["index", "data"])
    kind = rng.choice(["flip", "flip", "truncate", "extend"])
    pos, bit = rng.randrange(1 << 20), rng.randrange(8)
    cut = rng.random()
    extra = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 64])))

    def change(files: Files) -> None:
        name = _first_data(files) if target == "data" else ""
        data = bytearray(files.data[name] if name else files.index)
        if kind == "flip":
            if not data:
                raise Skip
            data[pos % len(data)] ^= 1 << bit
        elif kind == "truncate":
            del data[int(cut * len(data)) :]
        else:
            data += extra
        if name:
            files.data[name] = bytes(data)
        else:
            files.index = bytes(data)

    return Op(f"raw {target}: {kind} pos {pos} (mod len) bit {bit} cut {cut:.3f} "
              f"extra {len(extra)}", change, False, ["raw"])


STATE_TEXTS = [
    b'model_checkpoint_path: "../victim/ckpt"\nall_model_checkpoint_paths: "../victim/ckpt"\n',
    b'model_checkpoint_path: "/etc/passwd"\n',
    b'model_checkpoint_path: ""\n',
    b"model_checkpoint_path: \"ckpt-1\"\nmodel_checkpoint_path: \"ckpt-2\"\n",
    b'model_checkpoint_path: "ckpt-9"\n',
    b"\xff\x00garbage",
    b"model_checkpoint_path: " + b"a" * 5000,
    b'model_checkpoint_path: "\\xff"\n',
    b"",
    b"all_model_checkpoint_paths: {",
]


def _state_file_op(rng: random.Random, info: Info) -> Op:
    text = rng.choice(STATE_TEXTS)

    def change(files: Files) -> None:
        if files.state is None:
            raise Skip
        files.state = text

    return Op(f"state file := {text[:50]!r}", change, False, ["state"])
