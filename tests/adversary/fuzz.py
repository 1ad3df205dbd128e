"""The structured fuzzer's runner: ``python -m tests.adversary.fuzz --cases N --seed S``.

``make fuzz`` runs 100,000 cases on two processes; ``tests/adversary/test_fuzz.py`` runs a
seeded slice in ``make test``. Cases are numbered: case ``i`` of seed ``S`` is the same
mutation of the same checkpoint on any machine (each finding prints its ``--case`` replay).
Workers are separate processes (spawned, so each imports torch and JAX itself) whose address
space is capped at what they use after setup plus ``--memory-mb``: an allocation far beyond a
file's size fails there as a ``MemoryError``, a finding, instead of taking the machine. A case
has ``--case-seconds`` (SIGALRM) before it counts as a hang; a worker that dies is a finding
too. Exit status: 0 without findings, 1 with.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.adversary.fuzzer import CASE_SECONDS, Finding, Fuzzer  # noqa: E402

_FUZZER: Fuzzer | None = None


def _cap_memory(extra_mb: int) -> None:
    """Cap this process's address space at its current size plus ``extra_mb``."""
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (size + (extra_mb << 20), resource.RLIM_INFINITY))


def _init(sources: list[str] | None, memory_mb: int, case_seconds: float) -> None:
    global _FUZZER
    from tests.adversary.fuzz_sources import build_sources

    root = tempfile.mkdtemp(prefix="trackpoint-fuzz-")
    atexit.register(shutil.rmtree, root, True)
    # A worker process of its own: hostile cases log and warn by the thousand (an in-process
    # Fuzzer, as test_fuzz's, leaves the test session's logging and warnings alone).
    logging.getLogger("trackpoint").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")
    _FUZZER = Fuzzer(root, build_sources(os.path.join(root, "sources"), sources), case_seconds)
    if memory_mb > 0 and sys.platform.startswith("linux"):
        _cap_memory(memory_mb)


def _run_chunk(seed: int, start: int, stop: int) -> tuple[int, list[Finding]]:
    assert _FUZZER is not None
    findings = []
    for case in range(start, stop):
        try:
            finding = _FUZZER.run(seed, case)
        except MemoryError:  # outside a guarded call (minimizing): still the case's finding
            finding = Finding(seed, case, "?", "MemoryError outside the checks", [], "")
        if finding is not None:
            findings.append(finding)
    return stop - start, findings


def run(seed: int, cases: int, *, start: int = 0, jobs: int = 2, sources: list[str] | None = None,
        memory_mb: int = 1024, case_seconds: float = CASE_SECONDS, chunk: int = 200,
        progress: bool = True) -> list[Finding]:
    """Run cases ``start`` to ``start + cases`` of ``seed`` on ``jobs`` worker processes."""
    chunks = [(seed, a, min(a + chunk, start + cases)) for a in range(start, start + cases, chunk)]
    findings: list[Finding] = []
    done = 0
    began = time.monotonic()
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                               initializer=_init, initargs=(sources, memory_mb, case_seconds))
    try:
        futures = {pool.submit(_run_chunk, *args): args for args in chunks}
        for future in as_completed(futures):
            try:
                count, found = future.result()
            except BrokenProcessPool as exc:
                _, a, b = futures[future]
                findings.append(Finding(seed, a, "?", f"worker died in cases {a}-{b - 1}", [],
                                        repr(exc)))
                break
            done += count
            findings.extend(found)
            if progress:
                print(f"  {done}/{cases} cases, {len(findings)} findings, "
                      f"{time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # SIGINT: report the chunks that finished
        print(f"interrupted: {done} of {cases} cases finished", file=sys.stderr, flush=True)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
    else:
        pool.shutdown()
    run.completed = done  # type: ignore[attr-defined]
    return sorted(findings, key=lambda f: f.case)


def summarize(findings: list[Finding]) -> str:
    """Each distinct signature once (its first case, minimized), with its count."""
    counts = collections.Counter(f.signature for f in findings)
    first: dict[str, Finding] = {}
    for finding in findings:
        first.setdefault(finding.signature, finding)
    return "\n\n".join(f"{counts[s]} x {first[s].report()}" for s, _ in counts.most_common())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first case number")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--case", type=int, help="replay this one case in this process")
    parser.add_argument("--sources", help="comma-separated: numpy,sliced,torch,jax")
    parser.add_argument("--memory-mb", type=int, default=1024,
                        help="address space a worker may add after setup (0: no cap)")
    parser.add_argument("--case-seconds", type=float, default=CASE_SECONDS)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    sources = args.sources.split(",") if args.sources else None
    began = time.monotonic()
    if args.case is not None:
        _init(sources, args.memory_mb, args.case_seconds)
        assert _FUZZER is not None
        source, ops = _FUZZER.draw(args.seed, args.case)
        print(f"case {args.case} of seed {args.seed}: source {source.name}")
        for op in ops:
            print(f"  - {op.desc}")
        finding = _FUZZER.run(args.seed, args.case)
        print(finding.report() if finding else "no finding")
        return 1 if finding else 0
    findings = run(args.seed, args.cases, start=args.start, jobs=args.jobs, sources=sources,
                   memory_mb=args.memory_mb, case_seconds=args.case_seconds,
                   progress=not args.quiet)
    wall = time.monotonic() - began
    distinct = len({f.signature for f in findings})
    completed = getattr(run, "completed", args.cases)
    partial = "" if completed == args.cases else f", INTERRUPTED after {completed} cases"
    print(f"fuzz: seed {args.seed}, cases {args.start}-{args.start + args.cases - 1} "
          f"({args.cases}), jobs {args.jobs}: {len(findings)} findings ({distinct} distinct), "
          f"wall {wall:.0f} s{partial}")
    if findings:
        print(summarize(findings))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
