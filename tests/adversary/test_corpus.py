"""Every library reader and every CLI command against every item of the hostile-file corpus.

The invariant (issue 27, Part 2): each call finishes (a deadline turns a hang into a failure),
and either raises a ``trackpoint.errors`` type having changed no live object, or gives exactly
the values saved. The CLI exits with the README's status and a message on stderr, and with
``--json`` prints exactly one JSON document on stdout, errors included. Items whose fix
belongs to another finding say so in ``CorpusItem.pending`` (shown in failure messages).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from corpus import (
    CLI_ALL,
    GRAPH_KEY,
    ITEMS,
    PY_STATE_KEY,
    W_KEY,
    CorpusItem,
    base_state,
    build_corpus,
    build_item,
    live_state,
)

import trackpoint as tp
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.cli.main import main
from trackpoint.errors import CheckpointError

DEADLINE = 30.0  # seconds per call; a FIFO opened for reading blocks forever
_NOT_REGULAR = ("fifo_index", "fifo_data", "dir_index", "dir_data", "loop_data")
HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CorpusItem]:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A clean checkpoint of the same values, the other side of ``diff``."""
    return str(tp.Checkpoint(model=base_state()).save(str(tmp_path_factory.mktemp("ref") / "c")))


def _same(a: Any, b: Any) -> bool:
    """Exact equality: dtype, shape and bytes for arrays; == for plain values."""
    if isinstance(b, np.ndarray):
        a = np.asarray(a, dtype=b.dtype if b.dtype == object else None)
        if b.dtype == object:
            return a.shape == b.shape and a.tolist() == b.tolist()
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    return type(a) is type(b) and a == b


def _saved_value(item: CorpusItem, key: str, got: Any) -> None:
    """A value a reader returned must be the one saved under ``key``."""
    assert key in item.values, f"{item.name}: a value came back for {key!r}, which has none"
    assert _same(got, item.values[key]), f"{item.name}: {key!r} read as {got!r}"


# -- library readers: each returns normally (after checking what it returned) or raises ------


def _load_checkpoint(item: CorpusItem) -> None:
    reader = tp.load_checkpoint(item.path)
    keys = list(reader.get_variable_to_shape_map())
    assert keys, f"{item.name}: a checkpoint without values"
    for key in keys:
        _saved_value(item, key, reader.get_tensor(key))


def _list_variables(item: CorpusItem) -> None:
    for key, shape in tp.list_variables(item.path):
        if key in item.values:
            assert list(shape) == list(item.values[key].shape), (item.name, key, shape)


def _load_variable(item: CorpusItem) -> None:
    for key in (W_KEY, PY_STATE_KEY):
        _saved_value(item, key, tp.load_variable(item.path, key))


def _object_metadata(item: CorpusItem) -> None:
    graph = tp.object_metadata(item.path)
    assert graph == TrackableObjectGraph.FromString(item.values[GRAPH_KEY].item()), item.name


def _inside(item: CorpusItem, prefix: str) -> bool:
    real = os.path.realpath(prefix)
    return os.path.dirname(real) == os.path.realpath(item.directory)


def _latest_checkpoint(item: CorpusItem) -> None:
    latest = tp.latest_checkpoint(str(item.directory))
    assert latest is None or _inside(item, latest), f"{item.name}: latest is {latest}"
    if item.benign:
        assert latest is not None


def _get_checkpoint_state(item: CorpusItem) -> None:
    state = tp.get_checkpoint_state(str(item.directory))
    if state is not None:
        for prefix in [state.model_checkpoint_path, *state.all_model_checkpoint_paths]:
            assert _inside(item, prefix), f"{item.name}: the state names {prefix}"


def _restored(item: CorpusItem, live: dict[str, Any]) -> None:
    expected = base_state()
    assert _same(live, expected), f"{item.name}: restored {live}, saved {expected}"


def _checkpoint_into(method: str) -> Callable[[CorpusItem], None]:
    def run(item: CorpusItem) -> None:
        live = live_state()
        before = copy.deepcopy(live)
        ckpt = tp.Checkpoint(model=live)
        try:
            getattr(ckpt, method)(item.path).assert_consumed()
        except BaseException:
            assert _same(live, before), f"{item.name}: {method} raised after changing {live}"
            raise
        _restored(item, live)

    return run


def _jax_restore(item: CorpusItem) -> None:
    tree = tp.jax.restore(item.path)
    model = tree["model"]
    expected = base_state()
    for name in ("w", "b"):
        assert _same(np.asarray(model[name]), expected[name]), (item.name, name, model[name])
    assert model["cfg"] == expected["cfg"], (item.name, model["cfg"])


def _torch_reader(item: CorpusItem) -> None:
    state = tp.torch.load_state_dict(item.path, root="model")
    expected = base_state()
    assert sorted(state) == ["b", "w"], (item.name, sorted(state))
    for name in ("w", "b"):
        assert _same(state[name].numpy(), expected[name]), (item.name, name, state[name])


READERS: dict[str, Callable[[CorpusItem], None]] = {
    "load_checkpoint": _load_checkpoint,
    "list_variables": _list_variables,
    "load_variable": _load_variable,
    "object_metadata": _object_metadata,
    "latest_checkpoint": _latest_checkpoint,
    "get_checkpoint_state": _get_checkpoint_state,
    "checkpoint_read": _checkpoint_into("read"),
    "checkpoint_restore": _checkpoint_into("restore"),
}
if HAS_JAX:
    READERS["jax_restore"] = _jax_restore
if HAS_TORCH:
    READERS["torch_reader"] = _torch_reader


def _note(item: CorpusItem) -> str:
    return f" [depends on finding {item.pending}]" if item.pending else ""


@pytest.mark.parametrize("name", list(ITEMS))
def test_library_readers(corpus: dict[str, CorpusItem], name: str, deadline) -> None:
    item = corpus[name]
    failures = []
    for reader_name, read in READERS.items():
        try:
            with deadline(DEADLINE, f"{reader_name} on {name}"):
                read(item)
        except CheckpointError as exc:
            if item.benign:
                failures.append(f"{reader_name} raised on a benign item: {exc!r}")
            elif not str(exc):
                failures.append(f"{reader_name} raised {type(exc).__name__} without a message")
            elif (
                name in _NOT_REGULAR
                and reader_name in item.must_raise
                and ("not a regular file" not in str(exc))
            ):
                failures.append(f"{reader_name}: unclear message {exc}")
        except (AssertionError, deadline.Hang) as exc:
            failures.append(f"{reader_name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - anything else is the failure we look for
            failures.append(f"{reader_name} raised {type(exc).__name__}: {str(exc)[:200]}")
        else:
            if reader_name in item.must_raise:
                failures.append(f"{reader_name} raised nothing")
    assert not failures, f"{name}{_note(item)}:\n  " + "\n  ".join(failures)


# -- the manager: construction and restore_or_initialize, on a fresh copy (it writes) ----------


@pytest.mark.parametrize("name", list(ITEMS))
def test_manager(tmp_path: Path, name: str, deadline) -> None:
    item = build_item(name, tmp_path)
    victim_files = (
        {p.name: p.read_bytes() for p in item.victim.iterdir() if p.is_file()}
        if item.victim is not None else {}
    )  # fmt: skip
    live = live_state()
    before = copy.deepcopy(live)
    failure = ""
    try:
        with deadline(DEADLINE, f"CheckpointManager on {name}"):
            manager = tp.CheckpointManager(tp.Checkpoint(model=live), str(item.directory), 1)
            restored = manager.restore_or_initialize()
            if restored is not None:
                _restored(item, live)
            elif item.benign:
                failure = "restore_or_initialize found nothing to restore"
            if item.victim is not None:  # finding 3: never delete outside the directory
                manager.save()
                manager.save()
            manager.sync()
    except CheckpointError as exc:
        if item.benign and name != "fifo_lock_file":  # a FIFO lock file may be refused
            failure = f"raised on a benign item: {exc!r}"
        elif not _same(live, before):
            failure = f"raised {exc!r} after changing {live}"
    except (AssertionError, deadline.Hang) as exc:
        failure = str(exc)
    except Exception as exc:  # noqa: BLE001
        failure = f"raised {type(exc).__name__}: {str(exc)[:200]}"
    if item.victim is not None:
        now = {p.name: p.read_bytes() for p in item.victim.iterdir() if p.is_file()}
        if now != victim_files:
            failure += f" the manager changed {item.victim}: {sorted(victim_files)} -> "
            failure += str(sorted(now))
    assert not failure, f"{name}{_note(item)}: {failure}"


# -- the CLI, in process: every command, with and without --json -----------------------------


def _argv(command: str, item: CorpusItem, reference: str, out: Path) -> list[str]:
    if command == "cat":
        return ["cat", item.path, "model.w"]
    if command == "diff":
        return ["diff", item.path, reference]
    if command == "report":
        return ["report", item.path, "-o", str(out / "report.html")]
    if command == "convert":
        return ["convert", item.path, str(out / "converted.safetensors"), "--force"]
    return [command, item.path]


JSON_COMMANDS = ("ls", "info", "objects", "verify", "diff", "stats", "tree")


def _check_cli(item: CorpusItem, command: str, argv: list[str], code: int, out: str,
               err: str) -> list[str]:  # fmt: skip
    problems = []
    allowed = {0} if item.benign else set(item.cli_status)
    if command not in item.cli_strict and not item.benign:
        allowed.add(0)
    if code not in allowed:
        problems.append(f"`{' '.join(argv[:1] + argv[2:])}` exited {code}, expected "
                        f"{sorted(allowed)}: {err.strip()[-300:]}")  # fmt: skip
    if code != 0 and not err.strip():
        problems.append(f"`{argv[0]}` exited {code} with nothing on stderr")
    if code != 0 and item.name in _NOT_REGULAR and "not a regular file" not in err:
        problems.append(f"`{argv[0]}`: the message does not say what the file is: {err[-300:]}")
    if code != 0 and "what" in item.extra and item.extra["what"] not in err:
        problems.append(f"`{argv[0]}`: the message does not say {item.extra['what']}: {err}")
    if "--json" in argv:
        try:
            doc = json.loads(out)
        except ValueError:
            problems.append(f"`{argv[0]} --json` printed no single JSON document: {out!r:.200}")
        else:
            is_error = isinstance(doc, dict) and "error" in doc
            if code not in (0, 1) or (code == 1 and command not in ("verify", "info")):
                if not is_error or doc["error"]["exit_status"] != code:
                    problems.append(f"`{argv[0]} --json` exit {code} without its error: {doc}")
            if is_error and not doc["error"]["message"]:
                problems.append(f"`{argv[0]} --json`: an error document without a message")
    return problems


@pytest.mark.parametrize("name", list(ITEMS))
def test_cli_commands(corpus: dict[str, CorpusItem], reference: str, name: str, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str], deadline) -> None:  # fmt: skip
    item = corpus[name]
    problems = []
    for command in sorted(CLI_ALL):
        variants = [_argv(command, item, reference, tmp_path)]
        if command in JSON_COMMANDS:
            variants.append([*variants[0], "--json"])
        for argv in variants:
            capsys.readouterr()
            try:
                with deadline(DEADLINE, f"trackpoint {' '.join(argv)}"):
                    code = main(argv)
            except deadline.Hang as exc:
                problems.append(str(exc))
                continue
            captured = capsys.readouterr()
            problems += _check_cli(item, command, argv, code, captured.out, captured.err)
    assert not problems, f"{name}{_note(item)}:\n  " + "\n  ".join(problems)


# -- the CLI as a separate process, on FIFOs (a hang cannot hide behind the test's own process)


@pytest.mark.parametrize(
    ("name", "argv", "status", "says"),
    [
        ("fifo_data", ["verify", "--json"], 1, "FIFO"),
        ("fifo_index", ["stats"], 1, "FIFO"),
        ("path_is_fifo", ["ls", "--json"], 2, "a FIFO"),
    ],
)
def test_cli_process_on_fifos(tmp_path: Path, name: str, argv: list[str], status: int,
                              says: str) -> None:  # fmt: skip
    item = build_item(name, tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "trackpoint.cli", argv[0], item.path, *argv[1:]],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == status, run.stderr
    assert says in run.stderr, run.stderr
    if "--json" in argv:
        doc = json.loads(run.stdout)
        if argv[0] != "verify":
            assert doc["error"]["exit_status"] == status and says in doc["error"]["message"]
        else:
            assert doc["ok"] is False and says in doc["damaged"][0]["problem"]


def test_the_corpus_runs_every_command() -> None:
    """A command added to the CLI must be added here (``demo`` reads no checkpoint)."""
    import argparse

    from trackpoint.cli.main import _parser

    actions = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(actions[0].choices) == set(CLI_ALL) | {"demo"}
