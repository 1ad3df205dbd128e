"""The ``trackpoint`` command: inspect, compare, verify and convert checkpoints; run the demo.

Works on any TensorFlow V2 checkpoint, including ones TensorFlow wrote, without TensorFlow.
Exit status (:data:`EXIT_OK`, :data:`EXIT_DAMAGE`, :data:`EXIT_USAGE`): 0 success; 1 damage
found (a checksum, a truncated or missing file, an index that does not parse; also ``diff
--exit-code`` when the checkpoints differ); 2 usage errors and anything not found (no such
checkpoint, key or object path, bad arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rich.console import Console

from trackpoint.cli import convert as convert_cmd
from trackpoint.cli import diff, inspect_cmds, report, stats, tree

__all__ = ["EXIT_DAMAGE", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_USAGE = 2

_EPILOG = (
    "Output: rich tables on a terminal, one unwrapped line per row in a pipe, JSON with --json "
    "(ls, info, objects, verify, diff, stats, tree). Exit status: 0 ok, 1 damage found (or "
    "diff --exit-code: the checkpoints differ), 2 usage error or not found."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trackpoint",
        description="Inspect, compare, verify and convert TensorFlow-compatible checkpoints.",
        epilog=_EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect_cmds.add_parsers(sub)
    stats.add_parser(sub)
    diff.add_parser(sub)
    tree.add_parser(sub)
    report.add_parser(sub)
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


def _error(message: str) -> None:
    stderr = Console(stderr=True, soft_wrap=True, highlight=False)
    if stderr.is_terminal:
        stderr.print("[bold red]error:[/] ", end="")
        stderr.out(message, highlight=False)
    else:
        sys.stderr.write(f"error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trackpoint`` console script; returns the exit status.

    Usage errors return 2 (argparse's status) instead of raising ``SystemExit``, so callers
    and tests get a number for every outcome.
    """
    from trackpoint.errors import CheckpointError, DataLossError

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    console = Console()
    try:
        return int(args.func(args, console) or 0)
    except DataLossError as exc:
        _error(str(exc))
        return EXIT_DAMAGE
    except CheckpointError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader of a pipe stopped early (`trackpoint ls PATH | head`): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # e.g. report -o into a missing directory
        _error(str(exc))
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
