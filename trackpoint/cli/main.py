"""The ``trackpoint`` command: inspect, compare, verify and convert checkpoints; run the demo.

Works on any TensorFlow V2 checkpoint, including ones TensorFlow wrote, without TensorFlow.
Exit status (:data:`EXIT_OK`, :data:`EXIT_DAMAGE`, :data:`EXIT_USAGE`, :data:`EXIT_INTERNAL`):
0 success; 1 damage found (a checksum, a truncated, missing or not regular file, an index that
does not parse; also ``diff --exit-code`` when the checkpoints differ); 2 usage errors and
anything not found (no such checkpoint, key or object path, bad arguments); 3 a bug. Every
command reports errors through :func:`trackpoint.cli.failures.run_command`, the one place that
maps an exception to a status, a message on stderr and, with ``--json``, one JSON document.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console

from trackpoint.cli import convert as convert_cmd
from trackpoint.cli import diff, inspect_cmds, report, stats, tree
from trackpoint.cli.failures import (
    EXIT_DAMAGE,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    Failure,
    report_failure,
    run_command,
)
from trackpoint.errors import InvalidArgumentError

__all__ = ["EXIT_DAMAGE", "EXIT_INTERNAL", "EXIT_OK", "EXIT_USAGE", "main"]

_EPILOG = (
    "Output: rich tables on a terminal, one unwrapped line per row in a pipe, JSON with --json "
    "(ls, info, objects, verify, diff, stats, tree; errors too, as {\"error\": {...}}). Exit "
    "status: 0 ok, 1 damage found (or diff --exit-code: the checkpoints differ), 2 usage error "
    "or not found, 3 internal error (a bug)."
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so usage errors take the one
    error path (and become a JSON document, type ``"UsageError"``, under ``--json``)."""

    def error(self, message: str) -> NoReturn:
        raise InvalidArgumentError(f"{message}\n{self.format_usage().rstrip()}")


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trackpoint`` console script; returns the exit status.

    Usage errors return 2 instead of raising ``SystemExit``, so callers and tests get a number
    for every outcome; with ``--json`` anywhere on the line they print an error document too.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except InvalidArgumentError as exc:  # argparse refused the command line
        failure = Failure(EXIT_USAGE, "UsageError", str(exc))
        return report_failure(failure, json_mode="--json" in argv)
    return run_command(args.func, args, Console())


if __name__ == "__main__":
    sys.exit(main())
