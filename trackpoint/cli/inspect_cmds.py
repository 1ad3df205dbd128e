"""``trackpoint ls | info | verify | cat | objects``: read-only views of a checkpoint.

Each prints a rich table on a terminal, unwrapped plain lines in a pipe, and with ``--json``
one JSON document (see :mod:`trackpoint.cli.output`). ``verify`` reports damage, including an
index that does not parse, and exits with 1.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from rich.console import Console

from trackpoint.bundle import BundleReader, DataType, data_filename, index_filename
from trackpoint.cli.names import resolve_key
from trackpoint.cli.output import Column, Output
from trackpoint.cli.progress import human_bytes
from trackpoint.cli.stats import check_slices_cover
from trackpoint.errors import CheckpointError, DataLossError, InvalidArgumentError
from trackpoint.management.paths import resolve_location, resolve_prefix
from trackpoint.management.reader import CheckpointReader
from trackpoint.storage import CheckpointLocation

__all__ = [
    "add_parsers",
    "cmd_cat",
    "cmd_info",
    "cmd_ls",
    "cmd_objects",
    "cmd_verify",
    "data_file_sizes",
]

_PATH_HELP = "checkpoint prefix, one of its files, or a directory (its latest checkpoint)"


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ls``, ``info``, ``verify``, ``cat`` and ``objects`` to ``trackpoint``."""
    p = subparsers.add_parser("ls", help="list tensors: key, dtype, shape, bytes")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("--stats", action="store_true", help="also show size, shards, bytes per shard")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {key, dtype, shape, bytes, slices}")
    p.set_defaults(func=cmd_ls)

    p = subparsers.add_parser("info", help="size, shard count and bytes per data file")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_info)

    p = subparsers.add_parser(
        "verify", help="check every tensor's checksum; exit 1 and a report on damage"
    )
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("--json", action="store_true", help="print {ok, damaged: [...]} as JSON")
    p.set_defaults(func=cmd_verify)

    p = subparsers.add_parser("cat", help="print one tensor")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument(
        "key", help="checkpoint key (model/w/.ATTRIBUTES/VARIABLE_VALUE) or object path "
        "(model.w, model/w)",
    )
    p.set_defaults(func=cmd_cat)

    p = subparsers.add_parser("objects", help="show the object graph as paths")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("--json", action="store_true", help="print the nodes as JSON")
    p.set_defaults(func=cmd_objects)


def _dtype_name(reader: BundleReader, key: str) -> str:
    if reader.datatype(key) == DataType.DT_STRING:
        return "string"
    return str(reader.dtype(key))


# Missing data files named one by one; beyond this many, a count (a damaged header may
# declare 2**31 shards: nothing here is done once per declared shard).
_NAMED_MISSING = 20


def _present_shards(location: CheckpointLocation, num_shards: int) -> list[int]:
    """Shard ids whose data file is in the directory: one listing, not one look-up per
    declared shard."""
    storage, prefix = location.storage, location.prefix
    base = storage.basename(prefix)
    head, tail = f"{base}.data-", f"-of-{num_shards:05d}"
    found = []
    for name in storage.list(storage.dirname(prefix) or "."):
        if not (name.startswith(head) and name.endswith(tail)):
            continue
        digits = name[len(head):len(name) - len(tail)]
        if digits.isdigit() and int(digits) < num_shards and (
            storage.basename(data_filename(prefix, int(digits), num_shards)) == name
        ):
            found.append(int(digits))
    return sorted(found)


def _first_missing(present: list[int], num_shards: int) -> tuple[list[int], int]:
    """The first missing shard ids (at most ``_NAMED_MISSING``) and how many are missing."""
    count = num_shards - len(present)
    have = set(present)
    first: list[int] = []
    shard = 0
    while len(first) < min(count, _NAMED_MISSING):
        if shard not in have:
            first.append(shard)
        shard += 1
    return first, count


def data_file_sizes(location: CheckpointLocation, num_shards: int) -> list[tuple[str, int]]:
    """(file name, bytes) of each data file of the checkpoint at ``location``; -1 if missing
    (the first ``_NAMED_MISSING`` missing ones; :func:`missing_data_files` counts them all)."""
    storage, prefix = location.storage, location.prefix
    present = _present_shards(location, num_shards)
    missing, _ = _first_missing(present, num_shards)
    out = []
    for shard in sorted(present + missing):
        path = data_filename(prefix, shard, num_shards)
        gone = shard in missing or not storage.exists(path)  # listed: a dangling link too
        out.append((storage.basename(path), -1 if gone else storage.size(path)))
    return out


def missing_data_files(location: CheckpointLocation, num_shards: int) -> int:
    """How many of the checkpoint's declared data files are not in its directory."""
    return num_shards - len(_present_shards(location, num_shards))


def damaged_data_files(location: CheckpointLocation, num_shards: int) -> list[tuple[str, str]]:
    """(data file, what is wrong) for each data file of ``prefix`` that is missing or is not a
    regular file (a FIFO, a directory...): damage that needs no byte read to see."""
    storage, prefix = location.storage, location.prefix
    present = _present_shards(location, num_shards)
    missing, count = _first_missing(present, num_shards)
    damaged = []
    for shard in sorted(present + missing):
        path = data_filename(prefix, shard, num_shards)
        kind = "a missing path" if shard in missing else storage.describe(path)
        if kind not in ("a regular file", "an existing path"):
            damaged.append((storage.basename(path), "missing" if kind == "a missing path"
                            else f"{kind}, not a regular file"))  # fmt: skip
    if count > len(missing):
        damaged.append((f"{count - len(missing):,} more data files", "missing"))
    return damaged


def _raise_damaged(prefix: str, damaged: list[tuple[str, str]]) -> None:
    if damaged:
        what = "; ".join(f"{name}: {problem}" for name, problem in damaged)
        raise DataLossError(
            f"checkpoint {prefix} is damaged: {len(damaged)} data file(s) missing or not "
            f"regular files ({what}). `trackpoint info {prefix}` lists its files; restore them "
            "from a copy or use another checkpoint",
            path=prefix,
        )


def _tensor_rows(reader: BundleReader) -> list[dict[str, Any]]:
    rows = []
    for key in reader.keys():
        rows.append({
            "key": key, "dtype": _dtype_name(reader, key), "shape": list(reader.shape(key)),
            "bytes": reader.stored_bytes(key),
            "slices": len(reader.slices(key)) if reader.entry(key).slices else 0,
        })  # fmt: skip
    return rows


def cmd_ls(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint ls``."""
    out = Output(console, json=args.json)
    if args.json and args.stats:
        raise InvalidArgumentError(
            "ls --json lists tensors only; for files and shards as JSON use `trackpoint info "
            "--json PATH`"
        )
    location = resolve_location(args.path)
    prefix = location.prefix
    with BundleReader(prefix, storage=location.storage) as reader:
        tensors = _tensor_rows(reader)
        if out.json_mode:
            _raise_damaged(prefix, damaged_data_files(location, reader.num_shards))
            out.json(tensors)
            return 0
        out.table(
            [Column("key", fold=True), Column("dtype"), Column("shape"), Column("bytes", "right")],
            [[t["key"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]"
              + (f" ({t['slices']} slices)" if t["slices"] else ""), f"{t['bytes']:,}"]
             for t in tensors],
            title=prefix,
        )  # fmt: skip
        out.line(f"{len(tensors)} tensors, {human_bytes(sum(t['bytes'] for t in tensors))}")
        if args.stats:
            _print_files(out, _files(location, reader.num_shards))
        # The listing needs the index only; a data file gone is still damage (exit 1).
        _raise_damaged(prefix, damaged_data_files(location, reader.num_shards))
    return 0


def _files(location: CheckpointLocation, num_shards: int) -> dict[str, Any]:
    """The checkpoint's files and sizes: what ``trackpoint.metrics`` records for a save."""
    storage, prefix = location.storage, location.prefix
    files = data_file_sizes(location, num_shards)
    damaged = damaged_data_files(location, num_shards)
    index_bytes = storage.size(index_filename(prefix))
    # Data files with more than one name (hard links of incremental saves, docs/incremental.md)
    # hold bytes this checkpoint shares with others: deleting it frees none of them.
    directory = storage.dirname(prefix)
    bad = {name for name, _ in damaged}
    shared = sum(size for name, size in files if size > 0 and name not in bad
                 and storage.link_count(storage.join(directory, name)) > 1)
    return {
        "prefix": prefix,
        "index": {"file": storage.basename(index_filename(prefix)), "bytes": index_bytes},
        "data": [{"file": name, "bytes": size if size >= 0 else None} for name, size in files],
        "num_shards": num_shards,
        "total_bytes": index_bytes + sum(max(size, 0) for _, size in files),
        "missing": [name for name, size in files if size < 0],
        "missing_count": missing_data_files(location, num_shards),
        "damaged": [{"file": name, "problem": problem} for name, problem in damaged],
        "shared_bytes": shared,
    }


def _print_files(out: Output, info: dict[str, Any]) -> None:
    total = info["total_bytes"]

    def share(size: int) -> str:
        return f"{100 * size / total:.1f}%" if total else "-"

    index = info["index"]
    rows = [[index["file"], f"{index['bytes']:,}", share(index["bytes"])]]
    for item in info["data"]:
        size = item["bytes"]
        rows.append([item["file"], *(("missing", "-") if size is None
                                      else (f"{size:,}", share(size)))])  # fmt: skip
    out.table(
        [Column("file", fold=True), Column("bytes", "right"), Column("share", "right")],
        rows, title="files",
    )  # fmt: skip
    missing = info["missing_count"]
    note = f", [bold red]{missing} missing[/]" if missing else ""
    out.line(f"checkpoint size {human_bytes(total)} ({total:,} bytes), "
             f"{info['num_shards']} shard(s){note}")
    if info["shared_bytes"]:
        out.line(f"{human_bytes(info['shared_bytes'])} ({info['shared_bytes']:,} bytes) shared "
                 "with other checkpoints (hard links: not freed by deleting this one)")


def cmd_info(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint info``."""
    out = Output(console, json=args.json)
    location = resolve_location(args.path)
    prefix = location.prefix
    with BundleReader(prefix, storage=location.storage) as reader:
        info = _files(location, reader.num_shards)
    if out.json_mode:
        out.json(info)
    else:
        _print_files(out, info)
    if info["damaged"]:  # reported on stderr (and in the JSON's "damaged"): damage exits 1
        for item in info["damaged"]:
            out.error(f"[bold red]DAMAGED[/]: {item['file']} of {prefix}: {item['problem']}")
        return 1
    return 0


def _verify(
    location: CheckpointLocation, out: Output
) -> tuple[list[tuple[str, str]], int, int]:
    """(damaged key or file, problem) pairs, tensors checked, bytes checked."""
    prefix = location.prefix
    try:
        reader = BundleReader(prefix, storage=location.storage)
    except DataLossError as exc:  # the index itself is damaged: that is damage, not usage
        return [(index_filename(prefix), str(exc))], 0, 0
    problems: list[tuple[str, str]] = []
    with reader, out.progress("verifying") as bar:
        keys = reader.keys()
        sizes = {}
        for key in keys:
            try:
                sizes[key] = reader.stored_bytes(key)
            except CheckpointError as exc:
                problems.append((key, str(exc)))
        total, done = sum(sizes.values()), 0
        for key in sizes:
            try:
                check_slices_cover(reader, key)  # a huge declared shape over small slices
                reader.verify(key)
            except CheckpointError as exc:  # checksum, short file, missing data file
                problems.append((key, str(exc)))
            done += sizes[key]
            bar.update(done, total)
    return problems, len(keys), total


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint verify``: exit 1 when anything is damaged, with a report on stderr."""
    out = Output(console, json=args.json)
    location = resolve_location(args.path)
    prefix = location.prefix
    problems, count, total = _verify(location, out)
    if out.json_mode:
        out.json({
            "prefix": prefix, "ok": not problems, "tensors": count, "bytes": total,
            "damaged": [{"key": key, "problem": msg} for key, msg in problems],
        })  # fmt: skip
    if problems:  # on stderr in every mode, --json included
        out.error_table([Column("key", fold=True), Column("problem", fold=True)],
                        [list(p) for p in problems], title=f"damaged in {prefix}")
        what = f"{len(problems)} of {count} tensors are damaged" if count else (
            "the index is damaged")
        out.error(f"[bold red]FAILED[/]: {what}")
    else:
        out.line(f"[bold green]OK[/]: {count} tensors, {human_bytes(total)}, "
                 "every checksum matches")  # nothing in JSON mode
    return 1 if problems else 0


def cmd_cat(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint cat``: the key may be a checkpoint key or a readable object path."""
    location = resolve_location(args.path)
    with CheckpointReader(location.prefix, storage=location.storage) as reader:
        key = resolve_key(reader, args.key)
        value = reader.get_tensor(key)
    width = console.width if console.is_terminal else 10**6
    with np.printoptions(threshold=1000, linewidth=max(80, width)):
        console.file.write(f"{key}: dtype={value.dtype} shape={list(value.shape)}\n")
        console.file.write(repr(value) + "\n")
    return 0


def cmd_objects(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint objects``."""
    from trackpoint.graph.walk import node_names
    from trackpoint.management.inspection import object_metadata

    out = Output(console, json=args.json)
    prefix = resolve_prefix(args.path)
    graph = object_metadata(prefix)
    names = node_names(graph)
    if out.json_mode:
        out.json([
            {"node": node_id, "path": names[node_id],
             "attributes": [{"name": a.name, "key": a.checkpoint_key} for a in node.attributes],
             "children": [{"name": c.local_name, "node": c.node_id} for c in node.children]}
            for node_id, node in enumerate(graph.nodes)
        ])  # fmt: skip
        return 0
    out.table(
        [Column("node", "right"), Column("path", fold=True), Column("attributes", fold=True)],
        [[str(node_id), path, ", ".join(a.name for a in graph.nodes[node_id].attributes)]
         for node_id, path in sorted(names.items())],
        title=prefix,
    )  # fmt: skip
    return 0
