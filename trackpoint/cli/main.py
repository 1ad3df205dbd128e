"""The ``trackpoint`` command: inspect, verify and convert checkpoints; run the demo.

Works on any TensorFlow V2 checkpoint, including ones TensorFlow wrote, without TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from trackpoint.cli import convert as convert_cmd
from trackpoint.cli import inspect_cmds

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trackpoint",
        description="Inspect, verify and convert TensorFlow-compatible checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ls", help="list tensors: key, dtype, shape, bytes")
    p.add_argument("path", help="checkpoint prefix, or a directory (its latest checkpoint)")
    p.add_argument("--stats", action="store_true", help="also show size, shards, bytes per shard")
    p.set_defaults(func=inspect_cmds.cmd_ls)

    p = sub.add_parser("info", help="size, shard count and bytes per shard")
    p.add_argument("path")
    p.set_defaults(func=inspect_cmds.cmd_info)

    p = sub.add_parser("verify", help="check every tensor's checksum; exit 1 on damage")
    p.add_argument("path")
    p.set_defaults(func=inspect_cmds.cmd_verify)

    p = sub.add_parser("cat", help="print one tensor")
    p.add_argument("path")
    p.add_argument("key", help="checkpoint key, e.g. model/w/.ATTRIBUTES/VARIABLE_VALUE")
    p.set_defaults(func=inspect_cmds.cmd_cat)

    p = sub.add_parser("objects", help="show the object graph as paths")
    p.add_argument("path")
    p.set_defaults(func=inspect_cmds.cmd_objects)

    convert_cmd.add_parser(sub)

    p = sub.add_parser(
        "demo", help="train, checkpoint, get killed, resume, and verify against a clean run"
    )
    p.add_argument("--dir", default=None, help="working directory (default: a temporary one)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--backend", choices=("auto", "numpy", "torch"), default="auto",
        help="model to train: PyTorch if installed (auto), or the numpy one",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace, console: Console) -> int:
    from trackpoint.cli import demo

    return demo.run(args, console)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trackpoint`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    console = Console()
    from trackpoint.errors import CheckpointError

    try:
        return int(args.func(args, console) or 0)
    except CheckpointError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
