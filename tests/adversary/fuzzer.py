"""The structured fuzzer's invariant: one case = one mutated real checkpoint, read and restored.

Per case (``seed``, ``case``), a seeded ``random.Random`` picks a source (``fuzz_sources``) and
1-3 mutations (``fuzz_mutate``, ``fuzz_ops``), writes the mutated files to a directory of their
own, then:

* reads: ``tp.load_checkpoint`` and ``get_tensor`` of every key, ``list_variables``,
  ``object_metadata``, the state file (``latest_checkpoint``, ``get_checkpoint_state``);
* restores into a fresh copy of the source's live objects (``Checkpoint.restore`` +
  ``assert_consumed``; ``tp.jax.restore`` for JAX).

The invariant: each call either raises a ``trackpoint.errors`` type (a ``CheckpointError``),
and a failed restore leaves the live objects exactly as they were; or it gives exactly the
saved values (unless an op is ``semantic``: a valid checkpoint with other values). An
``AssertionError`` counts only when ``assert_consumed`` raised it. Anything else is a finding:
another exception type, a changed object after an error, a wrong value, a read of a path
outside the checkpoint's directory, a case over its time limit (``Hang``) or a ``MemoryError``
(the long runner caps each worker's address space, so an allocation far beyond the file
fails). A finding is minimized (ops dropped while it persists) before it is reported.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import trackpoint as tp
from tests.adversary.fuzz_mutate import Files, Op
from tests.adversary.fuzz_ops import generate
from tests.adversary.fuzz_sources import AssertFailed, Source, build_sources, same
from trackpoint.errors import CheckpointError

__all__ = ["Finding", "Fuzzer", "Hang"]

CASE_SECONDS = 30.0


class Hang(BaseException):
    """A case ran past its time limit (BaseException: no ``except Exception`` swallows it)."""


@dataclass
class Finding:
    seed: int
    case: int
    source: str
    signature: str  # what went wrong and where: one per distinct root cause, usually
    ops: list[str]
    detail: str

    def report(self) -> str:
        ops = "\n".join(f"    - {op}" for op in self.ops)
        return (f"[{self.signature}] seed {self.seed} case {self.case} source {self.source}\n"
                f"  ops (minimized):\n{ops}\n  replay: python -m tests.adversary.fuzz "
                f"--seed {self.seed} --case {self.case}\n  {self.detail}")


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"case ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    remaining = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, *remaining)
        signal.signal(signal.SIGALRM, previous)


def _where(exc: BaseException) -> str:
    """The innermost frame of trackpoint (else the innermost) that ``exc`` passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if f"{os.sep}trackpoint{os.sep}" in f.filename] or frames
    if not inside:
        return "?"
    frame = inside[-1]
    return f"{frame.filename.rsplit(os.sep + 'trackpoint' + os.sep, 1)[-1]}:{frame.lineno}"


class _Problem(Exception):
    def __init__(self, signature: str, detail: str) -> None:
        super().__init__(signature)
        self.signature = signature
        self.detail = detail


def _guard(step: str, call: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, result)``, ``(False, error)`` for a CheckpointError; raise a problem else."""
    try:
        return True, call()
    except CheckpointError as exc:
        return False, exc
    except (_Problem, Hang, AssertFailed):
        raise
    except BaseException as exc:  # noqa: BLE001  (the finding: any other type)
        detail = "".join(traceback.format_exception(exc)[-6:])[-1500:]
        raise _Problem(f"{step}: {type(exc).__name__} at {_where(exc)}", detail) from None


class Fuzzer:
    """Runs cases against ``sources`` (built under ``root`` unless given)."""

    def __init__(self, root: str, sources: list[Source] | None = None,
                 case_seconds: float = CASE_SECONDS) -> None:
        self.root = root
        self.sources = sorted(sources or build_sources(os.path.join(root, "sources")),
                              key=lambda s: s.name)
        self.case_seconds = case_seconds
        self.work = os.path.join(root, "case")

    def draw(self, seed: int, case: int) -> tuple[Source, list[Op]]:
        rng = random.Random(f"{seed}:{case}")
        source = rng.choice(self.sources)
        return source, generate(rng, source.info)

    def run(self, seed: int, case: int) -> Finding | None:
        source, ops = self.draw(seed, case)
        problem = self.check(source, ops)
        if problem is None:
            return None
        # Minimize: drop ops while the same problem remains.
        index = 0
        while len(ops) > 1 and index < len(ops):
            fewer = ops[:index] + ops[index + 1 :]
            again = self.check(source, fewer)
            if again is not None and again.signature == problem.signature:
                ops, problem = fewer, again
            else:
                index += 1
        return Finding(seed, case, source.name, problem.signature, [op.desc for op in ops],
                       problem.detail)

    def check(self, source: Source, ops: list[Op]) -> _Problem | None:
        files = source.files.copy()
        applied = []
        for op in ops:
            before = files.copy()
            try:
                op.apply(files)
                applied.append(op)
            except Exception:  # noqa: BLE001  (Skip, or what an earlier op left undecodable)
                files = before
        semantic = any(op.semantic for op in applied)
        prefix = self._write(source, files)
        try:
            with _time_limit(self.case_seconds):
                self._reads(source, prefix, semantic, files.rewritten, files.hostile)
                if files.state is not None:
                    self._state_file(source)
                if source.make_live is not None:
                    self._restore(source, prefix, semantic)
        except _Problem as problem:
            return problem
        except Hang as exc:
            return _Problem("hang", f"{exc} at {_where(exc)}")
        return None

    def _write(self, source: Source, files: Files) -> str:
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        prefix = os.path.join(self.work, source.prefix_name)
        with open(prefix + ".index", "wb") as f:
            f.write(files.index)
        for suffix, data in files.data.items():
            with open(prefix + suffix, "wb") as f:
                f.write(data)
        if files.state is not None:
            with open(os.path.join(self.work, "checkpoint"), "wb") as f:
                f.write(files.state)
        return prefix

    def _reads(self, source: Source, prefix: str, semantic: bool,
               rewritten: frozenset[str], hostile: frozenset[str]) -> None:
        opened, reader = _guard("load_checkpoint", lambda: tp.load_checkpoint(prefix))
        if opened:
            try:
                ok, shapes = _guard("get_variable_to_shape_map", reader.get_variable_to_shape_map)
                _guard("get_variable_to_dtype_map", reader.get_variable_to_dtype_map)
                for key in shapes if ok else ():
                    ok, value = _guard("get_tensor", lambda key=key: reader.get_tensor(key))
                    if ok and key in hostile:
                        raise _Problem("get_tensor: a hostile value read without an error",
                                       f"key {key!r}: {value!r}"[:800])
                    expected = source.reads.get(key)
                    if not ok or semantic or expected is None or key in rewritten:
                        continue
                    if isinstance(expected, type):
                        raise _Problem("get_tensor: a value read where the saved file has none",
                                       f"key {key!r}: pristine raised {expected.__name__}")
                    if not same(value, expected):
                        raise _Problem("get_tensor: wrong value",
                                       f"key {key!r}: {value!r} instead of {expected!r}"[:800])
            finally:
                _guard("CheckpointReader.close", reader.close)
        _guard("list_variables", lambda: tp.list_variables(prefix))
        _guard("object_metadata", lambda: tp.object_metadata(prefix))
        for label, (read, expected) in source.extra_reads.items():
            ok, value = _guard(label, lambda read=read: read(prefix))
            if ok and not semantic and not rewritten and not same(value, expected):
                raise _Problem(f"{label}: wrong value", f"{value!r}"[:800])

    def _state_file(self, source: Source) -> None:
        ok, latest = _guard("latest_checkpoint", lambda: tp.latest_checkpoint(self.work))
        _guard("get_checkpoint_state", lambda: tp.get_checkpoint_state(self.work))
        if ok and latest is not None:
            inside = os.path.realpath(os.path.dirname(latest)) == os.path.realpath(self.work)
            if not inside:
                raise _Problem("latest_checkpoint: a path outside the directory",
                               f"latest_checkpoint gave {latest!r}")

    def _restore(self, source: Source, prefix: str, semantic: bool) -> None:
        assert source.make_live is not None
        live = source.make_live()
        before = live.snapshot()
        try:
            ok, error = _guard("restore", lambda: live.restore(prefix))
        except AssertFailed:
            return  # assert_consumed refused: what it is for
        after = live.snapshot()
        if not ok:
            if not same(after, before):
                raise _Problem(f"restore: objects changed, then {type(error).__name__} at "
                               f"{_where(error)}", f"{error}"[:800])
        elif not semantic and not same(after, source.expected):
            raise _Problem("restore: wrong values, no error", f"{after!r}"[:800])
