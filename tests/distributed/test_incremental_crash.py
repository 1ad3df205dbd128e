"""Crash safety of distributed incremental saves: SIGKILL a 2-rank gloo job mid-save.

The distributed counterpart of tests/saving/test_save_crash.py (issue 16 item 4): a job of two
torch.distributed (gloo) processes saves incrementally in a loop through a
``CheckpointManager`` (``max_to_keep=2``): each rank links its own unchanged data files, the
coordinator merges and commits, the manager deletes old checkpoints. The test kills the job at
random moments (both ranks at once, or one rank and then the other), then checks that every
checkpoint whose index exists reads back exactly and passes ``verify``, and that the state file
names one that exists. Each restart restores the latest checkpoint, which becomes the
baseline the next save links from.

Importing torch.distributed takes seconds, so the ranks are forked from one *zygote* process
that imported everything once (``test_incremental_crash.py zygote``: each stdin line
``WORKDIR RANK WORLD INIT_FILE`` forks a rank and prints its pid); a trial then costs the gloo
setup and the saves. Set TRACKPOINT_CRASH_TRIALS for a longer soak.
"""

from __future__ import annotations

import faulthandler
import os
import random
import select
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import jobs
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS, COLS = 512, 512  # the table: 1 MiB of float32, half per rank


def _base(k: int) -> np.ndarray:
    return np.full((256, 1024), k, np.float32)  # 1 MiB each, replicated: data files of their own


def _table() -> np.ndarray:
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def _key(name: str) -> str:
    return f"{name}/.ATTRIBUTES/VARIABLE_VALUE"


def child(workdir: Path, rank: int, world: int, init_file: str) -> None:
    """One rank: restore the latest checkpoint (if any), then save incrementally forever."""
    import torch.distributed as dist

    import trackpoint as tp
    import trackpoint.distributed as tpd

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=timedelta(seconds=jobs.collective_timeout()),
    )  # fmt: skip
    rows = ROWS // world
    base = {f"w{k}": _base(k) for k in range(2)}
    table = _table()[rank * rows : (rank + 1) * rows].copy()
    adapter = np.zeros(16, np.float32)
    ckpt = tpd.DistributedCheckpoint(
        timeout=jobs.collective_timeout(), base=base, adapter=adapter,
        table=tpd.Slice(table, (ROWS, COLS), (rank * rows, 0)),
    )  # fmt: skip
    manager = tp.CheckpointManager(ckpt, workdir, max_to_keep=2)
    manager.restore_or_initialize()
    options = tp.CheckpointOptions(incremental=True, fsync=False)
    os.write(1, f"ready {rank}\n".encode())  # one write: lines of both ranks never mix
    while True:
        adapter[:] = int(ckpt.save_counter.numpy()) + 1  # checkpoint N holds N
        manager.save(options=options)


def _check(prefix: Path, number: int) -> None:
    from trackpoint.bundle.reader import BundleReader

    with BundleReader(str(prefix)) as reader:
        reader.verify()
        got = {key: reader.read(key) for key in reader.keys()}
    for k in range(2):
        np.testing.assert_array_equal(got[_key(f"base/w{k}")], _base(k), err_msg=str(prefix))
    np.testing.assert_array_equal(got[_key("table")], _table(), err_msg=str(prefix))
    assert (got[_key("adapter")] == number).all(), prefix
    assert int(got[_key("save_counter")]) == number, prefix


def zygote() -> None:
    """Import once, then fork a rank per stdin line; reaps nothing (SIGCHLD ignored)."""
    import torch.distributed  # noqa: F401  (the slow imports, done once)

    import trackpoint.distributed  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the killed ranks
    os.write(1, b"zygote\n")
    for line in sys.stdin:
        workdir, rank, world, init_file = line.split()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sys.stdin.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, if stuck
                child(Path(workdir), int(rank), int(world), init_file)
            finally:
                os._exit(code)
        os.write(1, f"pid {pid}\n".encode())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def test_sigkill_during_distributed_incremental_saves_keeps_every_checkpoint_valid(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")

    workdir = tmp_path / "ckpts"
    workdir.mkdir()
    rng = random.Random(int(os.environ.get("SEED", "16")))
    trials = int(os.environ.get("TRACKPOINT_CRASH_TRIALS", "4"))
    seen: set[int] = set()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    errors = tmp_path / "stderr"
    with open(errors, "w") as err:  # a file: the ranks' output can never fill a pipe
        zygote = subprocess.Popen(
            [sys.executable, __file__, "zygote"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=err, env=env, text=True,
        )  # fmt: skip
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        if _line(zygote, jobs.INIT_SECONDS) != "zygote\n":
            _timed_out("the zygote did not start", errors)
        for trial in range(trials):
            seen.update(_trial(zygote, workdir, trial, rng, errors))
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait()
        zygote.stdout.close()
    assert len(seen) >= trials  # the jobs committed checkpoints between kills
    linked = [
        n for n in os.listdir(workdir)
        if ".data-" in n and os.stat(workdir / n).st_nlink > 1
    ]  # fmt: skip
    assert linked  # the surviving checkpoints share their frozen files


def _timed_out(what: str, errors: Path) -> None:
    """A job that ran out of time (under load) is not a wrong result: say so (jobs.py)."""
    pytest.fail(
        f"TIMED OUT UNDER LOAD (not a wrong result): {what} within {jobs.INIT_SECONDS:g} s "
        f"(raise TP_TEST_TIMEOUT_SCALE on a busy machine)\n{errors.read_text()[-6000:]}",
        pytrace=False,
    )


_pending: dict[int, bytes] = {}  # fd -> output read but not yet returned as lines


def _line(zygote: subprocess.Popen[str], seconds: float) -> str:
    """The zygote's (or a rank's) next line of output, or "" after ``seconds``.

    Read from the descriptor (unbuffered): a buffered reader could hold lines that
    ``select`` no longer sees.
    """
    assert zygote.stdout is not None
    fd = zygote.stdout.fileno()
    deadline = time.monotonic() + seconds
    while b"\n" not in _pending.get(fd, b""):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return ""
        _pending[fd] = _pending.get(fd, b"") + chunk
    line, _, rest = _pending[fd].partition(b"\n")
    _pending[fd] = rest
    return line.decode() + "\n"


def _trial(
    zygote: subprocess.Popen[str], workdir: Path, trial: int, rng: random.Random, errors: Path
) -> list[int]:
    """Start a job, kill it at a random moment, check what is left; the checkpoints present."""
    import trackpoint as tp

    assert zygote.stdin is not None and zygote.stdout is not None
    init = workdir.parent / f"init-{trial}-{time.monotonic_ns()}"
    pids: list[int] = []
    try:
        zygote.stdin.write("".join(f"{workdir} {rank} 2 {init}\n" for rank in range(2)))
        zygote.stdin.flush()
        ready = 0
        lines: list[str] = []
        while ready < 2 or len(pids) < 2:  # the ranks' "pid" and "ready" lines, interleaved
            line = _line(zygote, jobs.INIT_SECONDS)
            lines.append(line)
            if not line:
                for pid in pids:
                    os.kill(pid, signal.SIGUSR1)
                time.sleep(1)
                _timed_out(f"a rank is not ready (trial {trial}, {lines})", errors)
            if line.startswith("pid "):
                pids.append(int(line.split()[1]))
            ready += line.startswith("ready ")
        time.sleep(rng.uniform(0.02, 0.5))  # the random moment of the crash
        if trial % 2:  # one rank dies first; the other a moment later
            _kill(pids[rng.randrange(2)])
            time.sleep(rng.uniform(0.0, 0.05))
    finally:
        for pid in pids:
            _kill(pid)
    present = sorted(
        int(n[5:-6]) for n in os.listdir(workdir)
        if n.startswith("ckpt-") and n.endswith(".index")
    )  # fmt: skip
    for number in present:
        _check(workdir / f"ckpt-{number}", number)
    latest = tp.latest_checkpoint(workdir)
    if latest is not None:
        assert int(latest.rsplit("-", 1)[1]) in present, (latest, present)
    return present


if __name__ == "__main__":
    zygote()
