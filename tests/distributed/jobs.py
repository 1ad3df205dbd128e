"""Multi-process test jobs on a loaded machine: every timeout in one place, and a report that
tells a job that ran out of time from one that computed a wrong result.

A 2-core machine running other work stretches every step of a job (imports, ``jit``
compilation, gloo connections) by unpredictable amounts, so the timeouts here are generous;
they only bound how long a job that really hangs takes to fail. All scale with the
environment variable ``TP_TEST_TIMEOUT_SCALE`` (default 1; e.g. 3 on a very busy machine):

* :data:`JOB_SECONDS`: a whole job, every process, before the still-running ones are killed;
* :data:`INIT_SECONDS`: ``jax.distributed.initialize(initialization_timeout=...)`` and
  ``torch.distributed.init_process_group(timeout=...)`` (the connection of every process);
* :data:`COLLECTIVE_SECONDS`: ``DistributedCheckpoint(timeout=...)`` in the workers, torch's
  gloo operations and XLA's CPU collectives (``--xla_cpu_collective_timeout_seconds``: JAX's
  gloo collectives otherwise give up after 30 s, ``DEADLINE_EXCEEDED``).

Workers read theirs from the environment :func:`job_env` sets (:func:`init_timeout`,
:func:`collective_timeout`). Tests whose subject is a timeout (a process killed, a rank that
never joins) keep their own short ones.

:func:`check` fails a job in one of two distinct ways: ``TIMED OUT UNDER LOAD`` when every
failing process ran out of time (killed at :data:`JOB_SECONDS`, or a collective or gloo
timeout), else an ``AssertionError`` naming the processes that failed otherwise (a wrong value
or an error); both show every process's exit code, result and output.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

SCALE = float(os.environ.get("TP_TEST_TIMEOUT_SCALE") or 1.0)
JOB_SECONDS = 900.0 * SCALE
INIT_SECONDS = 300.0 * SCALE
COLLECTIVE_SECONDS = 300.0 * SCALE
KILL_COLLECTIVE_SECONDS = 20.0 * SCALE
"""The collective timeout of tests whose subject is that timeout (a process killed mid-save):
long enough for the live processes to reach the call under load, short enough to wait for."""

_ENV_INIT = "TP_TEST_INIT_TIMEOUT"
_ENV_COLLECTIVE = "TP_TEST_COLLECTIVE_TIMEOUT"

# What a process's output or result says when it ran out of time rather than computed wrong.
TIMEOUT_SIGNS = (
    "did not reach the same call within",  # trackpoint's collectives
    "DEADLINE_EXCEEDED",  # JAX's coordination service and its gloo collectives
    "Timed out waiting",  # torch's gloo
    "[killed: still running",  # this module, at JOB_SECONDS
)


def init_timeout() -> float:
    """In a worker: seconds for the job's processes to connect (see the module docstring)."""
    return float(os.environ.get(_ENV_INIT) or INIT_SECONDS)


def collective_timeout() -> float:
    """In a worker: seconds a collective waits for the other processes."""
    return float(os.environ.get(_ENV_COLLECTIVE) or COLLECTIVE_SECONDS)


def jax_barrier(name: str) -> None:
    """In a ``jax.distributed`` worker: wait for every process at ``name``, through the
    coordination service with :func:`collective_timeout` (no XLA computation, no gloo: a
    process compiling slowly under load does not time out the others)."""
    from jax._src.distributed import global_state

    global_state.client.wait_at_barrier(name, int(collective_timeout() * 1000))


def xla_flags(devices: int = 2) -> str:
    """XLA_FLAGS of a worker: ``devices`` CPU devices, collectives waiting as long as ours."""
    seconds = int(collective_timeout())
    return (
        f"--xla_force_host_platform_device_count={devices} "
        f"--xla_cpu_collective_timeout_seconds={seconds} "
        f"--xla_cpu_collective_call_terminate_timeout_seconds={seconds}"
    )


def job_env(extra: dict[str, str] | None = None, *, devices: int = 2) -> dict[str, str]:
    """The environment of a job's processes: this repository importable, one thread each, JAX
    on ``devices`` CPU devices, and the timeouts of this module."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": xla_flags(devices),
        _ENV_INIT: str(init_timeout()),
        _ENV_COLLECTIVE: str(collective_timeout()),
        **(extra or {}),
    }


@dataclass
class Process:
    """One process of a finished job."""

    index: int
    returncode: int | None
    output: str
    """stdout and stderr, interleaved."""
    result: Any
    """What the process wrote to its result file (JSON), or None."""
    killed: bool
    """Still running at the job's deadline, and killed."""

    @property
    def stdout(self) -> str:
        """The output (stdout and stderr interleaved), named as by ``CompletedProcess``."""
        return self.output

    @property
    def timed_out(self) -> bool:
        """It ran out of time (killed, or a collective gave up waiting) rather than failed."""
        text = self.output + (json.dumps(self.result) if self.result is not None else "")
        return self.killed or any(sign in text for sign in TIMEOUT_SIGNS)


def run_job(
    commands: Sequence[Sequence[str]],
    workdir: Path,
    *,
    envs: Sequence[dict[str, str]] | None = None,
    results: Sequence[Path] | None = None,
    timeout: float = JOB_SECONDS,
) -> list[Process]:
    """Start one process per command, wait for all until ``timeout``, kill the rest.

    Output goes to files (not pipes: a process blocked on a full pipe while the others wait
    for it in a collective would look like a hang). ``results[i]``: the JSON file process
    ``i`` writes, read into :attr:`Process.result`.
    """
    logs = [workdir / f"output-{time.monotonic_ns()}-{i}.log" for i in range(len(commands))]
    procs = []
    try:
        for i, command in enumerate(commands):
            with open(logs[i], "w") as log:
                procs.append(subprocess.Popen(
                    list(command), stdout=log, stderr=subprocess.STDOUT, text=True,
                    env=envs[i] if envs is not None else job_env(),
                ))  # fmt: skip
        deadline = time.monotonic() + timeout
        killed = []
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                killed.append(False)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed.append(True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = []
    for i, proc in enumerate(procs):
        output = logs[i].read_text(errors="replace")
        if killed[i]:
            output += f"\n[killed: still running after {timeout:g} s]"
        result = None
        if results is not None:
            exists = results[i].exists()
            missing = {"ok": False, "error": "no result file"}
            result = json.loads(results[i].read_text()) if exists else missing
        out.append(Process(i, proc.returncode, output, result, killed[i]))
    return out


def report(procs: Sequence[Process], *, chars: int = 6000) -> str:
    """Every process's exit code, result and the end of its output."""
    parts = []
    for p in procs:
        state = "KILLED (timed out)" if p.killed else f"exit {p.returncode}"
        result = json.dumps(p.result)[-chars:] if p.result is not None else "(no result file)"
        parts.append(f"--- process {p.index}: {state}\n{result}\n{p.output[-chars:]}")
    return "\n".join(parts)


def check(procs: Sequence[Process], ok: Callable[[Process], bool] | None = None) -> None:
    """Fail unless every process is ``ok`` (default: exit 0 and ``result["ok"]`` when results
    are read), telling a timeout under load apart from a wrong result."""
    if ok is None:
        ok = _exited_ok
    failed = [p for p in procs if not ok(p)]
    if not failed:
        return
    if all(p.timed_out for p in failed):
        import pytest  # the workers import this module too; they need no pytest

        pytest.fail(
            f"TIMED OUT UNDER LOAD (not a wrong result): process(es) "
            f"{', '.join(str(p.index) for p in failed)} ran out of time (job limit "
            f"{JOB_SECONDS:g} s, collectives {COLLECTIVE_SECONDS:g} s; raise "
            f"TP_TEST_TIMEOUT_SCALE on a busy machine)\n{report(procs)}",
            pytrace=False,
        )
    wrong = [p.index for p in failed if not p.timed_out]
    raise AssertionError(
        f"process(es) {', '.join(map(str, wrong))} failed (a wrong result or an error, not a "
        f"timeout)\n{report(procs)}"
    )


def _exited_ok(p: Process) -> bool:
    if p.returncode != 0:
        return False
    return p.result is None or bool(p.result.get("ok", True))
