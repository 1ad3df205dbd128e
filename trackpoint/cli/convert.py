"""``trackpoint convert SRC DST``: between checkpoints, torch state_dicts and safetensors.

The formats come from the file names (``.safetensors``; ``.pt``/``.pth``/``.bin``; a checkpoint
prefix has no extension, or ``.ckpt``; other extensions such as ``.onnx`` are refused), or from
``--from``/``--to``. A tied weight goes under each of its names (``--no-aliases``: its first).
Works without TensorFlow; the torch format needs torch. Wired into ``trackpoint`` by
:func:`add_parser`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from trackpoint.cli.output import Column, Output
from trackpoint.cli.progress import human_bytes
from trackpoint.convert.convert import FORMATS, ConversionResult, convert
from trackpoint.convert.key_map import KeyMap

__all__ = ["add_parser", "cmd_convert"]

_SHOW_SKIPPED = 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand to ``trackpoint``'s subparsers; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "convert",
        help="convert between checkpoints, torch state_dict files and safetensors",
        description=(
            "Convert SRC to DST. Formats: a checkpoint prefix (TensorFlow V2, also a directory "
            "meaning its latest checkpoint), .pt/.pth/.bin (torch.save of tensors; loaded with "
            "weights_only=True) and .safetensors. Checkpoint keys become state_dict names by "
            "dropping '/.ATTRIBUTES/VARIABLE_VALUE' and joining object names with '.', and back."
        ),
    )
    parser.add_argument("src", help="source checkpoint prefix, directory, or file")
    parser.add_argument("dst", help="destination checkpoint prefix or file")
    parser.add_argument(
        "--map", dest="map_file", metavar="FILE",
        help="JSON key map: renames, regex rules (with transposes) and drops",
    )
    parser.add_argument(
        "--root", metavar="PATH",
        help="object path inside the checkpoint side, e.g. 'model': only values under it are "
        "read (and the path stripped), or values are written under it",
    )
    parser.add_argument("--from", dest="src_format", choices=FORMATS, help="source format")
    parser.add_argument("--to", dest="dst_format", choices=FORMATS, help="destination format")
    parser.add_argument("--force", action="store_true", help="overwrite an existing DST")
    parser.add_argument(
        "--no-aliases", dest="aliases", action="store_false",
        help="write a value reachable by several object paths (a tied weight) under its first "
        "name only; by default it gets every name module.state_dict() gives it",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="list every converted and skipped value"
    )
    parser.set_defaults(func=cmd_convert)
    return parser


def _run(args: argparse.Namespace, console: Console, key_map: KeyMap | None) -> ConversionResult:
    kwargs: dict[str, Any] = {
        "key_map": key_map, "root": args.root, "source_format": args.src_format,
        "destination_format": args.dst_format, "overwrite": args.force,
        "aliases": getattr(args, "aliases", True),
    }
    # A bar (bytes, rate, time left) only for large conversions on a terminal.
    with Output(console).progress("converting") as bar:
        return convert(args.src, args.dst, progress=bar.update, **kwargs)


def cmd_convert(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint convert``; returns the exit code (errors propagate as CheckpointError)."""
    key_map = KeyMap.load(args.map_file) if args.map_file else None
    result = _run(args, console, key_map)
    out = Output(console)
    out.line(
        f"[bold green]wrote[/] {escape(result.destination)} ({result.destination_format}): "
        f"{len(result.names)} tensors, {human_bytes(result.nbytes)} from "
        f"{escape(result.source)} ({result.source_format})"
    )
    if args.verbose and result.names:
        out.table([Column("source", fold=True), Column("destination", fold=True)],
                  [list(pair) for pair in result.names], title="converted")
    if result.skipped:
        shown = result.skipped if args.verbose else result.skipped[:_SHOW_SKIPPED]
        out.line(f"skipped {len(result.skipped)}:")
        for name, reason in shown:
            out.line(f"  {escape(name)}  [dim]({escape(reason)})[/]")
        if len(shown) < len(result.skipped):
            out.line(f"  … {len(result.skipped) - len(shown)} more (-v lists all)")
    return 0
