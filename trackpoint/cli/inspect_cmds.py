"""``trackpoint ls | info | verify | cat | objects``: read-only views of a checkpoint."""

from __future__ import annotations

import argparse
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

from trackpoint.bundle import BundleReader, DataType, data_filename, index_filename
from trackpoint.cli.progress import ByteProgress, human_bytes
from trackpoint.errors import CheckpointError
from trackpoint.management.paths import resolve_prefix
from trackpoint.storage import storage_for

__all__ = ["cmd_cat", "cmd_info", "cmd_ls", "cmd_objects", "cmd_verify", "data_file_sizes"]


def _dtype_name(reader: BundleReader, key: str) -> str:
    if reader.datatype(key) == DataType.DT_STRING:
        return "string"
    return str(reader.dtype(key))


def data_file_sizes(prefix: str, num_shards: int) -> list[tuple[str, int]]:
    """(file name, bytes) of each data file of the checkpoint at ``prefix``; -1 if missing."""
    storage = storage_for(prefix)
    out = []
    for shard in range(num_shards):
        path = data_filename(prefix, shard, num_shards)
        out.append((storage.basename(path), storage.size(path) if storage.exists(path) else -1))
    return out


def cmd_ls(args: argparse.Namespace, console: Console) -> int:
    prefix = resolve_prefix(args.path)
    with BundleReader(prefix) as reader:
        table = Table(title=prefix, title_justify="left")
        table.add_column("key", overflow="fold")
        table.add_column("dtype")
        table.add_column("shape")
        table.add_column("bytes", justify="right")
        total = 0
        for key in reader.keys():
            nbytes = reader.stored_bytes(key)
            total += nbytes
            shape = "[" + ", ".join(str(d) for d in reader.shape(key)) + "]"
            sliced = f" ({len(reader.slices(key))} slices)" if reader.entry(key).slices else ""
            table.add_row(key, _dtype_name(reader, key), shape + sliced, f"{nbytes:,}")
        console.print(table)
        console.print(f"{len(reader.keys())} tensors, {human_bytes(total)}")
        if args.stats:
            _print_stats(prefix, reader.num_shards, console)
    return 0


def _print_stats(prefix: str, num_shards: int, console: Console) -> None:
    """The checkpoint's files and sizes: what ``trackpoint.metrics`` records for a save."""
    storage = storage_for(prefix)
    files = data_file_sizes(prefix, num_shards)
    index_bytes = storage.size(index_filename(prefix))
    total = index_bytes + sum(max(size, 0) for _, size in files)
    table = Table(title="files", title_justify="left")
    table.add_column("file")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")

    def share(size: int) -> str:
        return f"{100 * size / total:.1f}%" if total else "-"

    table.add_row(storage.basename(index_filename(prefix)), f"{index_bytes:,}", share(index_bytes))
    for name, size in files:
        table.add_row(name, *(("missing", "-") if size < 0 else (f"{size:,}", share(size))))
    console.print(table)
    missing = sum(1 for _, size in files if size < 0)
    note = f", [bold red]{missing} missing[/]" if missing else ""
    console.print(
        f"checkpoint size {human_bytes(total)} ({total:,} bytes), {num_shards} shard(s){note}"
    )


def cmd_info(args: argparse.Namespace, console: Console) -> int:
    prefix = resolve_prefix(args.path)
    with BundleReader(prefix) as reader:
        _print_stats(prefix, reader.num_shards, console)
    return 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    prefix = resolve_prefix(args.path)
    problems: list[tuple[str, str]] = []
    with BundleReader(prefix) as reader:
        keys = reader.keys()
        sizes = {key: reader.stored_bytes(key) for key in keys}
        total, done = sum(sizes.values()), 0
        with ByteProgress(console, "verifying") as bar:  # large checkpoints on a terminal
            for key in keys:
                try:
                    reader.verify(key)
                except CheckpointError as exc:
                    problems.append((key, str(exc)))
                done += sizes[key]
                bar.update(done, total)
    if problems:
        table = Table(title=f"damaged tensors in {prefix}", title_justify="left")
        table.add_column("key", overflow="fold")
        table.add_column("problem", overflow="fold")
        for key, msg in problems:
            table.add_row(key, msg)
        Console(stderr=True).print(table)
        Console(stderr=True).print(
            f"[bold red]FAILED[/]: {len(problems)} of {len(keys)} tensors are damaged"
        )
        return 1
    total = sum(sizes.values())
    console.print(
        f"[bold green]OK[/]: {len(keys)} tensors, {human_bytes(total)}, every checksum matches"
    )
    return 0


def cmd_cat(args: argparse.Namespace, console: Console) -> int:
    prefix = resolve_prefix(args.path)
    with BundleReader(prefix) as reader:
        value = reader.read(args.key)
    with np.printoptions(threshold=1000, linewidth=max(80, console.width)):
        sys.stdout.write(f"{args.key}: dtype={value.dtype} shape={list(value.shape)}\n")
        sys.stdout.write(repr(value) + "\n")
    return 0


def cmd_objects(args: argparse.Namespace, console: Console) -> int:
    from trackpoint.graph.walk import node_names, object_metadata

    prefix = resolve_prefix(args.path)
    graph = object_metadata(prefix)
    table = Table(title=prefix, title_justify="left")
    table.add_column("node", justify="right")
    table.add_column("path", overflow="fold")
    table.add_column("attributes", overflow="fold")
    for node_id, path in sorted(node_names(graph).items()):
        attrs = ", ".join(a.name for a in graph.nodes[node_id].attributes)
        table.add_row(str(node_id), path, attrs)
    console.print(table)
    return 0
