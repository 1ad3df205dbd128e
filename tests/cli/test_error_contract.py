"""Issue 27 finding 17: the CLI's error contract, the same for every command.

README: exit 0 success, 1 damage (a checksum, a truncated, missing or not regular file, an
index that does not parse), 2 usage errors and anything not found, 3 an internal error (a
bug). ``--json`` prints exactly one JSON document on stdout whatever happens; errors are
``{"error": {"type", "message", "path", "key", "exit_status"}}``. Messages say what the path
is. All of it comes from one place, ``trackpoint.cli.failures``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.cli import inspect_cmds
from trackpoint.cli.main import EXIT_DAMAGE, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, main
from trackpoint.storage import CheckpointLocation

JSON_COMMANDS = ["ls", "info", "objects", "verify", "stats", "tree"]
EVERY_READER = [*JSON_COMMANDS, "cat", "report", "convert", "diff"]


@pytest.fixture
def prefix(tmp_path: Path) -> str:
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int64(3)}
    return tp.Checkpoint(model=state).save(str(tmp_path / "ckpt"))


def _argv(command: str, path: str, tmp_path: Path) -> list[str]:
    return {
        "cat": ["cat", path, "model.w"],
        "report": ["report", path, "-o", str(tmp_path / "r.html")],
        "convert": ["convert", path, str(tmp_path / "out.safetensors"), "--force"],
        "diff": ["diff", path, path],
    }.get(command, [command, path])


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error_doc(out: str) -> dict[str, object]:
    doc = json.loads(out)  # the whole of stdout is one document
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    error = doc["error"]
    assert isinstance(error, dict)
    assert set(error) == {"type", "message", "path", "key", "exit_status"}
    return error


@pytest.mark.parametrize("command", [*JSON_COMMANDS, "diff"])
def test_json_errors_are_one_document(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nothing-here")
    code, out, err = _run([*_argv(command, missing, tmp_path), "--json"], capsys)
    assert code == EXIT_USAGE
    error = _error_doc(out)
    assert error["type"] == "NotFoundError" and error["exit_status"] == EXIT_USAGE
    assert error["path"] == missing and "nothing-here" in str(error["message"])
    assert "nothing-here" in err  # and the message on stderr, as in every mode


@pytest.mark.parametrize("command", EVERY_READER)
def test_a_missing_data_file_is_damage_for_every_command(
    command: str, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path(prefix + ".data-00000-of-00001").unlink()
    code, out, err = _run(_argv(command, prefix, tmp_path), capsys)
    assert code == EXIT_DAMAGE, err
    assert "data-00000-of-00001" in err
    if command in JSON_COMMANDS or command == "diff":
        code, out, _ = _run([*_argv(command, prefix, tmp_path), "--json"], capsys)
        assert code == EXIT_DAMAGE
        doc = json.loads(out)
        if command == "verify":
            assert doc["ok"] is False
        elif command == "info":
            assert doc["missing"] == ["ckpt-1.data-00000-of-00001"]
        else:
            assert _error_doc(out)["exit_status"] == EXIT_DAMAGE


def test_messages_say_what_the_path_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    regular = tmp_path / "notes.txt"
    regular.write_text("hello")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    expected = {
        str(regular): "is a regular file, not a checkpoint",
        str(fifo): "is a FIFO (named pipe), not a checkpoint",
        str(tmp_path): "is a directory without a committed checkpoint",
        str(tmp_path / "gone" / "ckpt"): "there is no",
    }
    for path, says in expected.items():
        code, out, err = _run(["ls", path, "--json"], capsys)
        assert code == EXIT_USAGE and says in err, err
        assert says in str(_error_doc(out)["message"])


def test_a_fifo_data_file_is_named(
    prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = Path(prefix + ".data-00000-of-00001")
    data.unlink()
    os.mkfifo(data)

    def hang(signum: int, frame: object) -> None:
        raise TimeoutError("a FIFO hung the command")  # not a CheckpointError: fails the test

    previous = signal.signal(signal.SIGALRM, hang)
    try:
        for command in EVERY_READER:
            signal.setitimer(signal.ITIMER_REAL, 20.0)
            code, _, err = _run(_argv(command, prefix, tmp_path), capsys)
            signal.setitimer(signal.ITIMER_REAL, 0)
            assert code == EXIT_DAMAGE and "FIFO (named pipe), not a regular file" in err, command
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_usage_errors_with_json_are_a_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["ls", "--json"], capsys)  # PATH missing
    assert code == EXIT_USAGE
    error = _error_doc(out)
    assert error["type"] == "UsageError" and "path" in str(error["message"])
    assert "usage:" in err
    assert _run(["nosuchcommand"], capsys)[0] == EXIT_USAGE
    assert _run(["--help"], capsys)[0] == EXIT_OK


def test_a_bug_exits_3_with_a_document(
    prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object) -> list[object]:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(inspect_cmds, "_tensor_rows", broken)
    code, out, err = _run(["ls", prefix, "--json"], capsys)
    assert code == EXIT_INTERNAL
    error = _error_doc(out)
    assert error["type"] == "ZeroDivisionError" and "bug in trackpoint" in str(error["message"])
    assert "Traceback" in err


def test_a_failure_after_output_leaves_only_the_error(
    prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command that printed its document and then failed: stdout holds the error alone."""
    real = inspect_cmds._files

    def print_then_fail(location: CheckpointLocation, num_shards: int) -> dict[str, object]:
        real(location, num_shards)
        raise tp.errors.DataLossError("late damage", path=location.prefix)

    monkeypatch.setattr(inspect_cmds, "_files", print_then_fail)
    code, out, _ = _run(["info", prefix, "--json"], capsys)
    assert code == EXIT_DAMAGE and _error_doc(out)["message"] == "late damage"


def test_info_and_ls_exit_1_but_still_show_what_they_can(
    prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Path(prefix + ".data-00000-of-00001").unlink()
    code, out, err = _run(["info", prefix], capsys)
    assert code == EXIT_DAMAGE and "missing" in out and "DAMAGED" in err
    code, out, err = _run(["ls", prefix], capsys)
    assert code == EXIT_DAMAGE and "model/w/.ATTRIBUTES/VARIABLE_VALUE" in out
    assert "is damaged" in err


def test_the_console_script_follows_the_contract(prefix: str) -> None:
    Path(prefix + ".data-00000-of-00001").unlink()
    run = subprocess.run(
        [sys.executable, "-m", "trackpoint.cli", "stats", prefix, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == EXIT_DAMAGE, run.stderr
    assert json.loads(run.stdout)["error"]["type"] == "NotFoundError"
    assert run.stderr.startswith("error: ")


def test_verify_and_stats_refuse_slices_that_do_not_fill_the_declared_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """~200 index bytes declaring a 16 TiB tensor over two small slices: damage, not OK."""
    import shutil

    from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
    from trackpoint.bundle.table import read_table
    from trackpoint.bundle.table_batch import table_of_pairs

    golden = Path(__file__).parents[1] / "golden" / "bundle"
    for file in golden.glob("sliced.*"):
        shutil.copy(file, tmp_path / file.name)
    index = tmp_path / "sliced.index"
    rows = read_table(index.read_bytes(), str(index)).pairs()
    for i, (key, value) in enumerate(rows):
        if key == b"t":
            entry = BundleEntryProto.FromString(value)
            entry.shape.dim[0].size = 2**40  # declared [2**40, 10]; the slices hold [5, 10]
            rows[i] = (key, entry.SerializeToString())
    index.write_bytes(table_of_pairs(rows))
    prefix = str(tmp_path / "sliced")
    for command in ("verify", "stats"):
        code, _, err = _run([command, prefix], capsys)
        assert code == EXIT_DAMAGE and "declares shape [1099511627776, 10]" in err, err
