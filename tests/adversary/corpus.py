"""A corpus of hostile checkpoint directories, built under a test's ``tmp_path``.

Every item is a directory holding one checkpoint (``ckpt-1``, saved from :func:`base_state`)
and its ``checkpoint`` state file, with one thing made hostile: a FIFO, directory, symbolic
link (dangling, looping, pointing outside) where a file is expected; a state file naming a
checkpoint outside the directory; an index entry declaring a huge shape; an object graph with
node ids out of range; a plain Python value whose JSON is 100,000 levels deep or a
100,000-digit integer; truncated, empty and garbage files; a wrong header version; duplicate
index keys. Benign items (a symbolic link to a good file, a FIFO as the lock file, a
TensorFlow-style absolute state path into the same directory) must read normally.

``test_corpus.py`` runs every library reader and every CLI command against every item. Each
item says what a correct reader returns when it returns (:attr:`CorpusItem.values`: the bytes
a correct reader finds for each key) and what the README's exit status is when the CLI
notices the problem.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import trackpoint as tp
from trackpoint.bundle import BundleReader, BundleWriter, TensorSlice, encode_slice_key
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.table import read_table
from trackpoint.bundle.table_batch import table_of_pairs

__all__ = [
    "CLI_ALL",
    "CorpusItem",
    "GRAPH_KEY",
    "ITEMS",
    "PY_STATE_KEY",
    "W_KEY",
    "base_state",
    "build_corpus",
    "build_item",
    "live_state",
]

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
W_KEY = "model/w/.ATTRIBUTES/VARIABLE_VALUE"
B_KEY = "model/b/.ATTRIBUTES/VARIABLE_VALUE"
PY_STATE_KEY = "model/.ATTRIBUTES/py_state"
DATA = "ckpt-1.data-00000-of-00001"
INDEX = "ckpt-1.index"

CLI_ALL = frozenset({"ls", "info", "verify", "cat", "objects", "tree", "stats", "diff",
                     "report", "convert"})  # fmt: skip
"""Every CLI command that reads a checkpoint (``demo`` writes its own)."""
_READS_BYTES = frozenset({"verify", "stats"})  # commands that read every tensor's bytes
_READS_GRAPH = frozenset({"objects", "tree"})  # commands that must parse the object graph


def base_state() -> dict[str, Any]:
    """The values saved in every item (float32 so JAX keeps them as arrays)."""
    return {
        "w": np.arange(4, dtype=np.float32),
        "b": np.arange(4, dtype=np.float32) * 10 + 1,  # same shape and dtype as w: a node id
        "cfg": {"lr": 0.5, "n": 3},  # that wraps around would pass any shape check
    }


def live_state() -> dict[str, Any]:
    """Live objects to restore into: same structure as :func:`base_state`, other values."""
    return {"w": np.full(4, -1, np.float32), "b": np.full(4, -2, np.float32),
            "cfg": {"lr": 0.0, "n": 0}}  # fmt: skip


@dataclass
class CorpusItem:
    """One hostile (or benign) checkpoint directory."""

    name: str
    directory: Path
    path: str
    """What readers and the CLI are given: the prefix, or the directory for state-file items."""
    values: dict[str, np.ndarray]
    """Per key, the value a correct reader returns if it returns at all."""
    benign: bool = False
    """Every reader must succeed with :attr:`values`; every CLI command must exit 0."""
    cli_status: frozenset[int] = frozenset({1})
    """README exit statuses allowed once a command notices the problem."""
    cli_strict: frozenset[str] = CLI_ALL
    """Commands that must notice (exit in :attr:`cli_status`); the others may also exit 0."""
    must_raise: frozenset[str] = frozenset()
    """Library readers (names in test_corpus.py) that must raise a trackpoint error."""
    pending: str = ""
    """The finding of issue 27 another helper fixes, if this item depends on it."""
    victim: Path | None = None
    """A checkpoint outside :attr:`directory` the item points at; it must stay untouched."""
    extra: dict[str, Any] = field(default_factory=dict)


# -- building blocks -------------------------------------------------------------------------


def _save_base(directory: Path, state: dict[str, Any] | None = None) -> str:
    ckpt = tp.Checkpoint(model=state if state is not None else base_state())
    prefix = ckpt.save(str(directory / "ckpt"))
    assert (directory / "checkpoint").is_file() and prefix.endswith("ckpt-1")
    return prefix


def _values(prefix: str) -> dict[str, np.ndarray]:
    with BundleReader(prefix) as reader:
        return {key: reader.read(key) for key in reader.keys()}


def _rewrite_values(prefix: str, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Write the bundle again with ``edit``-ed values: checksums stay valid (hostile content,
    not damaged bytes)."""
    values = _values(prefix)
    edit(values)
    with BundleWriter(prefix) as writer:
        for key in sorted(values):
            writer.add(key, values[key])


def _rewrite_index(prefix: str, edit: Callable[[list[tuple[bytes, bytes]]], None]) -> None:
    """Write the index again from ``edit``-ed (key, value) rows, in the given order; a
    repeated key is written twice (the table builder refuses that, the file format does not)."""
    path = prefix + ".index"
    rows = read_table(Path(path).read_bytes(), path).pairs()
    edit(rows)
    Path(path).write_bytes(table_of_pairs(rows, ordered=False))  # duplicates on purpose


def _entry(rows: list[tuple[bytes, bytes]], key: str) -> tuple[int, BundleEntryProto]:
    for i, (k, v) in enumerate(rows):
        if k == key.encode():
            return i, BundleEntryProto.FromString(v)
    raise KeyError(key)


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dir(path: Path) -> None:
    path.mkdir()


# -- the items ---------------------------------------------------------------------------------
# Each builder gets the item's directory (base checkpoint saved), the prefix, the corpus root
# (for outside targets) and the values as saved; it returns the item.

Builder = Callable[[Path, str, Path, dict[str, np.ndarray]], CorpusItem]


def _file_item(target: str, make: Callable[[Path], None], status: int = 1, *,
               strict: frozenset[str] = CLI_ALL) -> Builder:  # fmt: skip
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        _replace(d / target, make)
        return CorpusItem("", d, prefix, values, cli_status=frozenset({status}),
                          cli_strict=strict, must_raise=frozenset({"load_checkpoint"}))  # fmt: skip

    return build


def _state_item(make: Callable[[Path], None], pending: str = "") -> Builder:
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        make(d / "checkpoint")
        # No committed checkpoint can be found through the directory: not found (2), or the
        # state file refused as damaged (1).
        return CorpusItem("", d, str(d), values, cli_status=frozenset({1, 2}),
                          must_raise=frozenset({"load_checkpoint", "checkpoint_read"}),
                          pending=pending)  # fmt: skip

    return build


def _state_text(text: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(text)

    return make


def _outside(absolute: bool) -> Builder:
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        victim = root / ("victim-abs" if absolute else "victim-rel")
        if not victim.exists():
            victim.mkdir()
            hostile = {"w": np.full(4, 666, np.float32), "b": np.full(4, 777, np.float32),
                       "cfg": {"lr": 6.66, "n": 666}}  # fmt: skip
            _save_base(victim, hostile)
        target = str(victim / "ckpt-1") if absolute else f"../{victim.name}/ckpt-1"
        (d / "checkpoint").write_text(
            f'model_checkpoint_path: "{target}"\nall_model_checkpoint_paths: "{target}"\n'
        )
        return CorpusItem("", d, str(d), values, cli_status=frozenset({1, 2}),
                          must_raise=frozenset({"load_checkpoint", "checkpoint_read"}),
                          pending="3 (manager: state file out of directory)",
                          victim=victim)  # fmt: skip

    return build


def _benign_state_absolute(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]
                           ) -> CorpusItem:  # fmt: skip
    (d / "checkpoint").write_text(f'model_checkpoint_path: "{prefix}"\n')  # TF writes these
    return CorpusItem("", d, str(d), values, benign=True)


def _symlink_data_outside(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]
                          ) -> CorpusItem:  # fmt: skip
    elsewhere = root / f"{d.name}-elsewhere"
    elsewhere.mkdir()
    shutil.move(d / DATA, elsewhere / DATA)
    (d / DATA).symlink_to(elsewhere / DATA)
    return CorpusItem("", d, prefix, values, benign=True)


def _symlinked_directory(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]
                         ) -> CorpusItem:  # fmt: skip
    link = root / f"{d.name}-link"
    link.symlink_to(d, target_is_directory=True)
    return CorpusItem("", d, str(link), values, benign=True)


def _fifo_lock(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
    lock = d / ".trackpoint.lock"
    if lock.exists():
        lock.unlink()
    os.mkfifo(lock)
    return CorpusItem("", d, prefix, values, benign=True)


def _path_is(make: Callable[[Path], None], what: str) -> Builder:
    """The PATH given is itself no checkpoint: a FIFO, a regular file... (exit 2, named)."""

    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        target = d / "given"
        make(target)
        return CorpusItem("", d, str(target), values, cli_status=frozenset({2}),
                          must_raise=frozenset({"load_checkpoint", "checkpoint_read"}),
                          extra={"what": what})  # fmt: skip

    return build


def _huge_shape(sliced: bool) -> Builder:
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        def edit(rows: list[tuple[bytes, bytes]]) -> None:
            i, entry = _entry(rows, W_KEY)
            if not sliced:
                del entry.shape.dim[:]
                entry.shape.dim.add(size=2**31)
                entry.shape.dim.add(size=2**31)
                rows[i] = (rows[i][0], entry.SerializeToString())
                return
            # A partitioned entry: declared [2**40, 4], one stored slice [0:1, :] holding w's
            # 16 bytes. ~200 index bytes declare 16 TiB.
            box = TensorSlice.from_bounds([0, 0], [1, 4])
            piece = BundleEntryProto()
            piece.CopyFrom(entry)
            del piece.shape.dim[:]
            piece.shape.dim.add(size=1)
            piece.shape.dim.add(size=4)
            full = BundleEntryProto(dtype=entry.dtype)
            full.shape.dim.add(size=2**40)
            full.shape.dim.add(size=4)
            full.slices.append(box.to_proto())
            rows[i] = (rows[i][0], full.SerializeToString())
            rows.append((encode_slice_key(W_KEY, box), piece.SerializeToString()))
            rows.sort(key=lambda row: row[0])

        _rewrite_index(prefix, edit)
        return CorpusItem("", d, prefix, {k: v for k, v in values.items() if k != W_KEY},
                          cli_strict=_READS_BYTES | {"cat"},
                          must_raise=frozenset({"load_checkpoint", "checkpoint_read"}),
                          pending="6 (read hardening: huge shapes)")  # fmt: skip

    return build


def _node_id(past_end: bool) -> Builder:
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        def edit(stored: dict[str, np.ndarray]) -> None:
            graph = TrackableObjectGraph.FromString(stored[GRAPH_KEY].item())
            n = len(graph.nodes)
            for node in graph.nodes:
                ids = {c.local_name: c.node_id for c in node.children}
                if "w" in ids and "b" in ids:
                    for child in node.children:
                        if child.local_name == "w":  # past the end, or wrapping onto b's node
                            child.node_id = n + 5 if past_end else ids["b"] - n
            stored[GRAPH_KEY] = np.array(graph.SerializeToString(), dtype=object)

        _rewrite_values(prefix, edit)
        return CorpusItem("", d, prefix, _values(prefix), cli_strict=_READS_GRAPH,
                          must_raise=frozenset({"checkpoint_read", "checkpoint_restore"}),
                          pending="5 (read hardening: node ids)")  # fmt: skip

    return build


def _hostile_json(text: bytes) -> Builder:
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        def edit(stored: dict[str, np.ndarray]) -> None:
            stored[PY_STATE_KEY] = np.array(text, dtype=object)

        _rewrite_values(prefix, edit)
        return CorpusItem("", d, prefix, _values(prefix), cli_strict=frozenset(),
                          must_raise=frozenset({"checkpoint_read", "checkpoint_restore"}),
                          pending="7 (read hardening: hostile JSON)")  # fmt: skip

    return build


def _bytes_of(target: str, change: Callable[[bytes], bytes], *, strict: frozenset[str]
              ) -> Builder:  # fmt: skip
    def build(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
        path = d / target
        path.write_bytes(change(path.read_bytes()))
        return CorpusItem("", d, prefix, values, cli_strict=strict,
                          must_raise=frozenset({"load_checkpoint"}))  # fmt: skip

    return build


def _garbage(raw: bytes) -> bytes:
    return np.random.default_rng(27).integers(0, 256, len(raw), dtype=np.uint8).tobytes()


def _wrong_version(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
    def edit(rows: list[tuple[bytes, bytes]]) -> None:
        header = BundleHeaderProto.FromString(rows[0][1])
        header.version.min_consumer = 1000  # written by a far newer format than this reader
        rows[0] = (b"", header.SerializeToString())

    _rewrite_index(prefix, edit)
    return CorpusItem("", d, prefix, values, cli_status=frozenset({2}),
                      must_raise=frozenset({"load_checkpoint", "checkpoint_read"}))  # fmt: skip


def _huge_num_shards(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]
                     ) -> CorpusItem:
    """A header declaring 2**31 - 1 data files (found by the fuzzer: ``info`` and ``ls``
    looked each one up and never finished)."""
    def edit(rows: list[tuple[bytes, bytes]]) -> None:
        header = BundleHeaderProto.FromString(rows[0][1])
        header.num_shards = 2**31 - 1
        rows[0] = (b"", header.SerializeToString())

    _rewrite_index(prefix, edit)
    return CorpusItem("", d, prefix, values, cli_strict=frozenset({"info", "ls", "verify"}))


def _duplicate_key(d: Path, prefix: str, root: Path, values: dict[str, np.ndarray]) -> CorpusItem:
    def edit(rows: list[tuple[bytes, bytes]]) -> None:
        i, _ = _entry(rows, W_KEY)
        _, b_entry = _entry(rows, B_KEY)
        rows.insert(i + 1, (rows[i][0], b_entry.SerializeToString()))  # w again, b's bytes

    _rewrite_index(prefix, edit)
    return CorpusItem("", d, prefix, values,
                      must_raise=frozenset({"load_checkpoint", "checkpoint_read"}))  # fmt: skip


ITEMS: dict[str, Builder] = {
    # Not regular files where the checkpoint's files are expected (finding 4).
    "fifo_index": _file_item(INDEX, _fifo),
    "fifo_data": _file_item(DATA, _fifo),
    "dir_index": _file_item(INDEX, _dir),
    "dir_data": _file_item(DATA, _dir),
    "dangling_index": _file_item(INDEX, lambda p: p.symlink_to("nowhere.index"), 2),
    "dangling_data": _file_item(DATA, lambda p: p.symlink_to("nowhere.data")),
    "loop_index": _file_item(INDEX, lambda p: p.symlink_to(p.name), 2),
    "loop_data": _file_item(DATA, lambda p: p.symlink_to(p.name)),
    "missing_data": _file_item(DATA, lambda p: None),
    # The state file: not a regular file, empty, garbage, or naming a checkpoint elsewhere.
    "fifo_state": _state_item(lambda p: (p.unlink(), os.mkfifo(p))),
    "dir_state": _state_item(lambda p: (p.unlink(), p.mkdir())),
    "loop_state": _state_item(lambda p: (p.unlink(), p.symlink_to(p.name))),
    "empty_state": _state_item(_state_text(b"")),
    "garbage_state": _state_item(_state_text(b"\xff\xfe not { a proto :::")),
    "state_outside_relative": _outside(absolute=False),
    "state_outside_absolute": _outside(absolute=True),
    # What the user gives is itself no checkpoint.
    "path_is_fifo": _path_is(_fifo, "a FIFO"),
    "path_is_regular_file": _path_is(lambda p: p.write_bytes(b"hello"), "a regular file"),
    # Hostile contents with valid checksums.
    "huge_shape_unsliced": _huge_shape(sliced=False),
    "huge_shape_sliced": _huge_shape(sliced=True),
    "node_id_negative": _node_id(past_end=False),
    "node_id_past_end": _node_id(past_end=True),
    "json_deep": _hostile_json(b'{"cfg":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "json_huge_int": _hostile_json(b'{"cfg":{"lr":0.5,"n":' + b"9" * 100_000 + b"}}"),
    "wrong_header_version": _wrong_version,
    "huge_num_shards": _huge_num_shards,
    "duplicate_keys": _duplicate_key,
    # Damaged bytes.
    "empty_index": _bytes_of(INDEX, lambda raw: b"", strict=CLI_ALL),
    "truncated_index": _bytes_of(INDEX, lambda raw: raw[: len(raw) // 2], strict=CLI_ALL),
    "garbage_index": _bytes_of(INDEX, _garbage, strict=CLI_ALL),
    "empty_data": _bytes_of(DATA, lambda raw: b"", strict=_READS_BYTES),
    "truncated_data": _bytes_of(DATA, lambda raw: raw[:8], strict=_READS_BYTES),
    "garbage_data": _bytes_of(DATA, _garbage, strict=_READS_BYTES),
    # Benign: must read exactly as saved.
    "symlink_data_outside": _symlink_data_outside,
    "symlinked_directory": _symlinked_directory,
    "state_absolute_inside": _benign_state_absolute,
    "fifo_lock_file": _fifo_lock,
}


def build_item(name: str, root: Path) -> CorpusItem:
    """Build corpus item ``name`` under ``root/name`` (``root`` may hold other items)."""
    directory = root / name
    directory.mkdir(parents=True)
    prefix = _save_base(directory)
    values = _values(prefix)
    item = ITEMS[name](directory, prefix, root, values)
    item.name = name
    return item


def build_corpus(root: Path) -> dict[str, CorpusItem]:
    """Every item of :data:`ITEMS`, under ``root``."""
    return {name: build_item(name, root) for name in ITEMS}
