"""trackpoint.errors holds every exception, under one root, and bad input gets one of them.

STYLE §4: everything trackpoint raises on purpose is a ``CheckpointError``; ``NotFoundError``
and ``InvalidArgumentError`` also inherit the builtins existing handlers catch; a wrong
argument type at the API edge is an ``InvalidArgumentError`` naming the argument.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint import errors
from trackpoint.errors import (
    CheckpointError,
    CollectiveError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    _StagingAborted,
)

PACKAGE = pathlib.Path(tp.__file__).parent


def _exception_classes() -> list[type[BaseException]]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]


def test_every_exception_in_errors_py_is_a_checkpoint_error() -> None:
    classes = _exception_classes()
    public = [c.__name__ for c in classes if not c.__name__.startswith("_")]
    assert sorted(public) == sorted(errors.__all__)
    for cls in classes:
        assert issubclass(cls, CheckpointError), cls


def test_builtin_bases() -> None:
    assert issubclass(NotFoundError, FileNotFoundError)
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(DataLossError, OSError)
    assert issubclass(FailedPreconditionError, RuntimeError)
    assert issubclass(_StagingAborted, FailedPreconditionError)
    assert not issubclass(CollectiveError, (FailedPreconditionError, InvalidArgumentError))


def test_errors_carry_path_and_key() -> None:
    exc = NotFoundError("missing", path="/tmp/x", key="w")
    assert (str(exc), exc.path, exc.key) == ("missing", "/tmp/x", "w")


def test_staging_aborted_is_private() -> None:
    # An internal signal between the stager and the async writer: users never see it.
    assert "StagingAborted" not in errors.__all__
    assert "StagingAborted" not in (errors.__doc__ or "")
    assert not hasattr(errors, "StagingAborted")


def test_moved_exceptions_keep_their_old_import_paths() -> None:
    pytest.importorskip("torch")
    import trackpoint.distributed as tpd
    from trackpoint.distributed.collective import CollectiveError as FromCollective

    assert FromCollective is CollectiveError is tpd.CollectiveError


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    # storage/_errors.py maps OSError to these classes; it defines none of its own.
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith("_pb2.py") or path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception", "Aborted"))
                for base in node.bases
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert offenders == []


def test_write_with_a_non_path_names_the_argument() -> None:
    with pytest.raises(InvalidArgumentError, match=r"prefix must be a str or os\.PathLike.*int"):
        tp.Checkpoint().write(123)


WRONG_TYPES: list[tuple[str, Callable[[pathlib.Path], Any], str]] = [
    ("save", lambda d: tp.Checkpoint().save(b"ckpt"), "prefix"),
    ("read", lambda d: tp.Checkpoint().read(1.5), "path"),
    ("restore", lambda d: tp.Checkpoint().restore(7), "path"),
    ("CheckpointManager", lambda d: tp.CheckpointManager(tp.Checkpoint(), 3, 1), "directory"),
    ("latest_checkpoint", lambda d: tp.latest_checkpoint(None), "directory"),
    ("get_checkpoint_state", lambda d: tp.get_checkpoint_state(4), "directory"),
    ("load_checkpoint", lambda d: tp.load_checkpoint(4), "path"),
    ("list_variables", lambda d: tp.list_variables(4), "path"),
    ("object_metadata", lambda d: tp.object_metadata(4), "path"),
    ("load_variable key", lambda d: tp.load_variable(_saved(d), 4), "key"),
    ("ParallelVariable", lambda d: tp.ParallelVariable(3), "list of per-device"),
    ("options", lambda d: tp.Checkpoint().write(str(d / "x"), options=3), "options"),
]  # fmt: skip


def _saved(directory: pathlib.Path) -> str:
    return tp.Checkpoint(v=tp.Variable(np.arange(3.0))).write(str(directory / "ckpt"))


@pytest.mark.parametrize(("call", "argument"), [(c, a) for _, c, a in WRONG_TYPES],
                         ids=[name for name, _, _ in WRONG_TYPES])  # fmt: skip
def test_public_entry_points_reject_wrong_types(
    tmp_path: pathlib.Path, call: Callable[[pathlib.Path], Any], argument: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=argument):
        call(tmp_path)


def test_pathlike_arguments_are_accepted(tmp_path: pathlib.Path) -> None:
    prefix = tp.Checkpoint(v=tp.Variable(1.0)).write(tmp_path / "ckpt")
    assert tp.list_variables(pathlib.Path(prefix))
