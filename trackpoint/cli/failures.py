"""The CLI's one error path: from an exception to an exit status, a message and a JSON document.

Every command runs through :func:`run_command`, so the exit status of an error depends on what
went wrong, never on which command met it (README, "The command line"):

- 0 success;
- 1 damage: bytes of a checkpoint are corrupt or truncated, one of its files is missing or is
  not a regular file (``DataLossError``, or a ``NotFoundError`` for a file of a checkpoint
  whose index exists); ``verify`` and ``info`` report damage they find themselves the same way;
- 2 usage: bad arguments, or something not found (a checkpoint, key, object path), or
  anything else trackpoint refuses on purpose (``CheckpointError``), or an ``OSError`` of the
  command itself (``report -o`` into a missing directory);
- 3 an internal error: an exception trackpoint did not raise on purpose is a bug; its
  traceback goes to stderr.

With ``--json`` stdout carries exactly one JSON document whatever happens: the command's own,
or ``{"error": {"type", "message", "path", "key", "exit_status"}}``. The command's output is
held back until it returns, so a command that fails half way never leaves a partial document
in front of the error. Messages always go to stderr too.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from trackpoint.errors import CheckpointError, DataLossError, NotFoundError

__all__ = [
    "EXIT_DAMAGE",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_USAGE",
    "Failure",
    "classify",
    "report_failure",
    "run_command",
]

EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

Command = Callable[[argparse.Namespace, Console], int | None]


@dataclass(frozen=True, slots=True)
class Failure:
    """What the CLI reports for one exception."""

    exit_status: int
    type: str
    """The exception's class name, e.g. ``"DataLossError"``."""
    message: str
    path: str | None = None
    key: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document for this failure."""
        return {"error": {"type": self.type, "message": self.message, "path": self.path,
                          "key": self.key, "exit_status": self.exit_status}}  # fmt: skip


def _missing_file_of_a_checkpoint(exc: NotFoundError) -> bool:
    """True when ``exc`` is about a data file of a checkpoint whose index exists: damage."""
    from trackpoint.management.state_file import checkpoint_exists

    path = exc.path or ""
    head, sep, _ = path.rpartition(".data-")
    if not sep or not head:
        return False
    try:
        return checkpoint_exists(head)
    except CheckpointError:
        return False


def classify(exc: BaseException) -> Failure:
    """The exit status and message for ``exc`` (see the module doc for the rules)."""
    name = type(exc).__name__
    if isinstance(exc, CheckpointError):
        damage = isinstance(exc, DataLossError) or (
            isinstance(exc, NotFoundError) and _missing_file_of_a_checkpoint(exc)
        )
        status = EXIT_DAMAGE if damage else EXIT_USAGE
        return Failure(status, name, str(exc), exc.path, exc.key)
    if isinstance(exc, OSError):  # the command's own file work, e.g. report -o
        path = exc.filename if isinstance(exc.filename, str) else None
        return Failure(EXIT_USAGE, name, str(exc), path)
    return Failure(
        EXIT_INTERNAL, name,
        f"internal error ({name}: {exc}); this is a bug in trackpoint, please report it with "
        "the traceback above",
    )  # fmt: skip


def _stderr_line(message: str) -> None:
    stderr = Console(stderr=True, soft_wrap=True, highlight=False)
    if stderr.is_terminal:
        stderr.print("[bold red]error:[/] ", end="")
        stderr.out(message, highlight=False)
    else:
        sys.stderr.write(f"error: {message}\n")


def report_failure(failure: Failure, *, json_mode: bool, stdout: Any = None) -> int:
    """Print ``failure`` (stderr; also stdout as JSON in ``json_mode``); its exit status."""
    _stderr_line(failure.message)
    if json_mode:
        out = stdout if stdout is not None else sys.stdout
        out.write(json.dumps(failure.to_json(), indent=2) + "\n")
        out.flush()
    return failure.exit_status


def _quiet_broken_pipe() -> int:
    # The reader of a pipe stopped early (`trackpoint ls PATH | head`): not an error. Later
    # writes (and the interpreter's final flush) go to /dev/null instead of raising again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests)
        pass
    finally:
        os.close(devnull)
    return EXIT_OK


def run_command(command: Command, args: argparse.Namespace, console: Console) -> int:
    """Run ``command`` and turn whatever it raises into an exit status, via :func:`classify`.

    With ``args.json`` the command writes into a buffer that reaches ``console.file`` only
    when it returns; an error replaces it with the error document.
    """
    json_mode = bool(getattr(args, "json", False))
    target = console.file
    if json_mode:
        console = Console(file=io.StringIO(), force_terminal=False, width=console.width)
    try:
        status = int(command(args, console) or 0)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - the one place every failure is reported
        failure = classify(exc)
        if failure.exit_status == EXIT_INTERNAL:
            traceback.print_exc(file=sys.stderr)
        return report_failure(failure, json_mode=json_mode, stdout=target)
    if json_mode:
        buffered = console.file
        assert isinstance(buffered, io.StringIO)
        try:
            target.write(buffered.getvalue())
            target.flush()
        except BrokenPipeError:
            return _quiet_broken_pipe()
    return status
