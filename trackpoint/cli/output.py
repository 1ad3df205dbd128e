"""How a command's results are shown: rich on a terminal, plain lines in a pipe, JSON on request.

On a terminal tables are drawn by rich and may wrap long checkpoint keys to the window. Piped
(``trackpoint ls PATH | grep kernel``) every row is one unwrapped line of columns separated by
two spaces, with no colour or box characters, so ``grep``, ``awk`` and ``cut`` see whole keys.
``--json`` prints one JSON document and nothing else on stdout; non-finite floats become
``null`` (JSON has no NaN). Errors and damage reports go to stderr in every mode.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trackpoint.cli.progress import ByteProgress

__all__ = ["Column", "Output", "format_number", "plain_lines", "to_json_value"]


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table."""

    header: str
    justify: str = "left"
    """``"left"`` or ``"right"`` (numbers)."""
    fold: bool = False
    """On a terminal, wrap this column's cells rather than cut them (keys, paths)."""


def format_number(value: float | None) -> str:
    """A figure for a table cell: six significant digits; ``-`` for none."""
    if value is None:
        return "-"
    return f"{value:.6g}"


def to_json_value(value: Any) -> Any:
    """``value`` with numpy scalars and arrays as Python values, NaN and ±inf as ``None``."""
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_json_value(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plain_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned lines (header first), columns two spaces apart, never wrapped."""
    table = [[c.header for c in columns], *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if column.justify == "right" else cell.ljust(width)
            for cell, width, column in zip(row, widths, columns)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class Output:
    """Where one command's results go, in the mode its stdout and flags ask for.

    Args:
        console: the rich console for stdout (its ``is_terminal`` picks rich or plain lines).
        json: the command was given ``--json``: only :meth:`json` writes to stdout.
    """

    def __init__(self, console: Console, *, json: bool = False) -> None:
        self.console = console
        self.json_mode = json
        self._stderr: Console | None = None

    @property
    def rich(self) -> bool:
        """True on a terminal (and not in JSON mode): draw with rich."""
        return self.console.is_terminal and not self.json_mode

    @property
    def stderr(self) -> Console:
        """A console for stderr; it follows the same terminal-or-plain rule as stdout."""
        if self._stderr is None:
            self._stderr = Console(stderr=True, soft_wrap=True, highlight=False)
        return self._stderr

    def _write(self, text: str) -> None:
        self.console.file.write(text + "\n")

    def line(self, markup: str) -> None:
        """A line of rich markup (plain text in a pipe; nothing in JSON mode)."""
        if self.json_mode:
            return
        if self.rich:
            self.console.print(markup, highlight=False)
        else:
            self._write(Text.from_markup(markup).plain)

    def text(self, text: str) -> None:
        """A line of literal text, no markup (nothing in JSON mode)."""
        if not self.json_mode:
            self._write(text)

    def table(
        self,
        columns: Sequence[Column],
        rows: Iterable[Sequence[str]],
        *,
        title: str | None = None,
        styles: Sequence[str | None] | None = None,
    ) -> None:
        """A table: rich with ``title`` on a terminal, aligned plain lines without it in a pipe.

        ``styles`` gives each row a rich style (e.g. ``"bold red"`` for damage), ignored in
        plain mode.
        """
        if self.json_mode:
            return
        rows = [list(row) for row in rows]
        if not self.rich:
            for line in plain_lines(columns, rows):
                self._write(line)
            return
        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(
                column.header,
                justify="right" if column.justify == "right" else "left",
                overflow="fold" if column.fold else "ellipsis",
            )
        for index, row in enumerate(rows):
            style = styles[index] if styles is not None else None
            table.add_row(*(Text(cell) for cell in row), style=style)
        self.console.print(table)

    def json(self, data: Any) -> None:
        """Print ``data`` as one JSON document (indented, valid: no NaN)."""
        self._write(json.dumps(to_json_value(data), indent=2, allow_nan=False))

    def error(self, markup: str) -> None:
        """A line of rich markup on stderr (plain text when stderr is not a terminal)."""
        if self.stderr.is_terminal:
            self.stderr.print(markup, highlight=False)
        else:
            sys.stderr.write(Text.from_markup(markup).plain + "\n")

    def error_table(
        self, columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str
    ) -> None:
        """A table on stderr (damage reports), rich or plain like :meth:`table`."""
        if self.stderr.is_terminal:
            Output(self.stderr).table(columns, rows, title=title)
        else:
            for line in plain_lines(columns, rows):
                sys.stderr.write(line + "\n")

    def progress(self, description: str) -> ByteProgress:
        """A byte progress bar on stderr, drawn only for large work when stderr is a terminal:
        it never mixes into piped or JSON output on stdout."""
        return ByteProgress(self.stderr, description)
