"""The multi-process harness (jobs.py) tells a job that ran out of time from a wrong result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jobs
import pytest


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_job_past_its_deadline_is_reported_as_timed_out_with_every_output(
    tmp_path: Path,
) -> None:
    procs = jobs.run_job(
        [_python("print('zero done')"), _python("import time; print('one', flush=True); "
                                                  "time.sleep(60)")],
        tmp_path, timeout=3,
    )  # fmt: skip
    assert [p.killed for p in procs] == [False, True]
    with pytest.raises(pytest.fail.Exception) as failure:
        jobs.check(procs)
    message = str(failure.value)
    assert message.startswith("TIMED OUT UNDER LOAD (not a wrong result): process(es) 1")
    assert "zero done" in message and "one" in message and "KILLED" in message


def test_a_collective_timeout_in_a_process_is_a_timeout_too(tmp_path: Path) -> None:
    code = ("import sys; print('CollectiveError: process(es) 1 did not reach the same call "
            "within 300 s'); sys.exit(1)")  # fmt: skip
    procs = jobs.run_job([_python(code)], tmp_path)
    with pytest.raises(pytest.fail.Exception, match="TIMED OUT UNDER LOAD"):
        jobs.check(procs)


def test_a_wrong_value_is_an_assertion_naming_the_process_even_beside_a_timeout(
    tmp_path: Path,
) -> None:
    # Process 1 computed a wrong value; process 0 then waited for it in vain.
    results = [tmp_path / "r0.json", tmp_path / "r1.json"]
    waiter = (
        f"import json; json.dump({{'ok': False, 'message': 'DEADLINE_EXCEEDED'}}, "
        f"open({str(results[0])!r}, 'w'))"
    )
    wrong = (
        f"import json; json.dump({{'ok': False, 'error': 'AssertionError: 3 != 4'}}, "
        f"open({str(results[1])!r}, 'w'))"
    )
    procs = jobs.run_job([_python(waiter), _python(wrong)], tmp_path, results=results)
    assert procs[1].result == {"ok": False, "error": "AssertionError: 3 != 4"}
    with pytest.raises(AssertionError) as failure:
        jobs.check(procs)
    message = str(failure.value)
    assert message.startswith("process(es) 1 failed (a wrong result or an error, not a timeout)")
    assert "3 != 4" in message and "DEADLINE_EXCEEDED" in message  # every process's output


def test_a_missing_result_file_fails_and_timeouts_reach_the_workers(tmp_path: Path) -> None:
    env = jobs.job_env()
    code = ("import os, json; print(json.dumps([os.environ['TP_TEST_INIT_TIMEOUT'], "
            "os.environ['TP_TEST_COLLECTIVE_TIMEOUT'], os.environ['XLA_FLAGS']]))")  # fmt: skip
    (proc,) = jobs.run_job([_python(code)], tmp_path, envs=[env], results=[tmp_path / "none"])
    init, collective, flags = json.loads(proc.output)
    assert float(init) == jobs.INIT_SECONDS and float(collective) == jobs.COLLECTIVE_SECONDS
    assert f"--xla_cpu_collective_timeout_seconds={int(jobs.COLLECTIVE_SECONDS)}" in flags
    with pytest.raises(AssertionError, match="no result file"):
        jobs.check([proc])
