"""One measured case: save → fsync → restore → verify, and trackpoint's async save."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from bench import measure, report
from bench.systems import System, from_stored_state, to_stored_specs, to_stored_state
from bench.workloads import BF16, TensorSpec, Workload, compare_tensors, many_workload

__all__ = [
    "CaseRunner",
    "Source",
    "describe",
    "measure_async",
    "probe",
    "release_frozen",
    "verify",
]

HOLD_LIMIT = 2 << 30  # above this the source is regenerated rather than kept beside copies
CACHE_LIMIT = 256 << 20  # below this prepared objects and templates are reused across reps


class Source:
    """The state every system saves; kept in memory, or regenerated for huge workloads."""

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload, self.seed = workload, seed
        self.held = workload.generate(seed) if workload.nbytes <= HOLD_LIMIT else None

    def state(self) -> dict[str, np.ndarray]:
        return self.held if self.held is not None else self.workload.generate(self.seed)

    def items(self) -> Any:
        return self.held.items() if self.held is not None else self.workload.iter_source(self.seed)


def verify(system: System, restored: Any, source: Source) -> str | None:
    """None when every restored tensor equals the source bit for bit, else the first problem."""
    specs = source.workload.specs
    got = from_stored_state(system, system.to_numpy(restored, to_stored_specs(system, specs)),
                            specs)
    if len(got) != len(source.workload.specs):
        return f"restored {len(got)} tensors, expected {len(source.workload.specs)}"
    for name, expected in source.items():
        if name not in got:
            return f"{name}: missing from the restored state"
        problem = compare_tensors(name, expected, got[name])
        if problem:
            return problem
    return None


def _freeze() -> None:
    """Move every live object out of the cyclic GC's reach until :func:`release_frozen`.

    Cached objects of all systems (100k tf.Variables, trackables, tensors) would otherwise make
    each collection, inside a timed region too, walk every other system's objects: a cost no
    single-framework program pays.
    """
    gc.collect()
    gc.freeze()


def release_frozen() -> None:
    """Undo :func:`_freeze` once the cached objects are dropped."""
    gc.unfreeze()
    gc.collect()


class CaseRunner:
    """Runs save → fsync → restore → verify for one system, reusing objects when small."""

    def __init__(self, system: System, source: Source) -> None:
        self.system, self.source = system, source
        self.cache = system.reuse_objects and source.workload.nbytes <= CACHE_LIMIT
        self._native: Any = None
        self._template: Any = None
        self.spent: dict[str, float] = {}  # seconds used per location

    def _native_for(self) -> Any:
        if self._native is not None:
            return self._native
        native = self.system.prepare_save(to_stored_state(self.system, self.source.state()))
        if self.cache:
            self._native = native
            _freeze()
        return native

    def _template_for(self) -> Any:
        if self._template is not None:
            self.system.reset_template(self._template)
            return self._template
        template = self.system.make_template(to_stored_specs(self.system,
                                                             self.source.workload.specs))
        if self.cache:
            self._template = template
            _freeze()
        return template

    def run_once(self, loc: str, loc_dir: str, cold: bool) -> tuple[float, float, str | None]:
        """One save and restore under ``loc_dir``: (save seconds, restore seconds, problem)."""
        start = time.perf_counter()
        case_dir = tempfile.mkdtemp(prefix=f"{self.system.key}-", dir=loc_dir)
        prefix = os.path.join(case_dir, "ckpt")
        try:
            native = self._native_for()
            gc.collect()
            t0 = time.perf_counter()
            self.system.save(native, prefix)
            measure.fsync_tree(case_dir)
            save_s = time.perf_counter() - t0
            del native
            if cold:
                measure.drop_file_cache(case_dir)
            template = self._template_for()
            gc.collect()
            t0 = time.perf_counter()
            restored = self.system.restore(prefix, template)
            restore_s = time.perf_counter() - t0
            del template
            problem = verify(self.system, restored, self.source)
            del restored
        finally:
            shutil.rmtree(case_dir, ignore_errors=True)
            self.spent[loc] = self.spent.get(loc, 0.0) + time.perf_counter() - start
        return save_s, restore_s, problem

    def close(self) -> None:
        self._native = self._template = None


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def measure_async(tp: System, source: Source, loc_dir: str, result: report.AsyncResult,
                  check: bool) -> None:
    """One repetition: async write, then copying the state into new and preallocated buffers."""
    state = source.state()
    native = tp.prepare_save(state)
    case_dir = tempfile.mkdtemp(prefix="tp-async-", dir=loc_dir)
    prefix = os.path.join(case_dir, "ckpt")
    try:
        gc.collect()
        t0 = time.perf_counter()
        tp.write_async(native, prefix)  # type: ignore[attr-defined]
        blocked = time.perf_counter() - t0
        tp.sync(native)  # type: ignore[attr-defined]
        measure.fsync_tree(case_dir)
        total = time.perf_counter() - t0
        if check:
            problem = verify(tp, tp.restore(prefix, tp.make_template(source.workload.specs)),
                             source)
            if problem:
                raise AssertionError(f"async checkpoint differs from the source: {problem}")
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)
    del native
    gc.collect()
    t0 = time.perf_counter()
    copies = {k: v.copy() for k, v in state.items()}
    new_s = time.perf_counter() - t0
    del copies
    dest = {k: np.empty_like(v) for k, v in state.items()}
    for d in dest.values():
        d.fill(0)
    gc.collect()
    t0 = time.perf_counter()
    for k, v in state.items():
        np.copyto(dest[k], v)
    pre_s = time.perf_counter() - t0
    del dest
    result.block_s.append(blocked)
    result.total_s.append(total)
    result.memcpy_new_s.append(new_s)
    result.memcpy_pre_s.append(pre_s)


PROBE = Workload("probe", "probe", (
    TensorSpec("w", (3, 5), np.dtype(np.float32)),
    TensorSpec("b", (7,), BF16),
    TensorSpec("step", (), np.dtype(np.int64)),
))


PROBES = {"tensors": PROBE, "many": many_workload(2)}
"""The probe of each Workload.kind: a system measures workloads of its ``kinds`` only."""


def probe(system: System, parent: str) -> None:
    """A tiny verified round trip: loads lazy imports and proves the system works here."""
    workload = PROBES[system.kinds[0]]
    _, _, problem = CaseRunner(system, Source(workload, 1)).run_once("probe", parent, cold=False)
    if problem:
        raise AssertionError(f"probe round trip differs: {problem}")
