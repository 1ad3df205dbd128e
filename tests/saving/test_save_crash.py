"""Crash safety: SIGKILL a process that saves in a loop, at random moments (DESIGN "atomic or
absent"). After every kill, each checkpoint whose index exists must read back exactly, every save
that returned must exist, and an overwritten prefix holds the old or the new values, never a mix.

Set TRACKPOINT_CRASH_TRIALS for a longer soak. fsync is off: a killed process loses nothing
from the page cache, so this checks the ordering of renames, not durability across power loss.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import NotFoundError
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

_VALUES = '''
def values(i):
    return {
        "a/.ATTRIBUTES/VARIABLE_VALUE": np.full((6, 5), i, np.float32),
        "b/.ATTRIBUTES/VARIABLE_VALUE": np.arange(10, dtype=np.int64) + i,
        "c/.ATTRIBUTES/VARIABLE_VALUE": np.array([str(i).encode() * 3, b""], dtype=object),
    }
'''

_CHILD = '''
import glob, os, sys
import numpy as np
from trackpoint.saving import CheckpointOptions, MaxShardSizePolicy, MultiDeviceSaver
''' + _VALUES + '''
directory, i = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
while True:
    i += 1
    # Alternate shard counts so overwrites hit both the same and other data file names.
    policy = MaxShardSizePolicy(48 if i % 2 else 4096)
    options = CheckpointOptions(sharding_policy=policy, fsync=False)
    saver = MultiDeviceSaver({None: values(i)})
    saver.save(os.path.join(directory, f"ckpt-{i}"), options)
    saver.save(os.path.join(directory, "same"), options)
    with open(os.path.join(directory, "log"), "a") as log:
        log.write(f"{i}\\n")
    old = os.path.join(directory, f"ckpt-{i - 4}")
    if os.path.exists(old + ".index"):
        os.remove(old + ".index")  # the index first: a half-deleted checkpoint is absent
        for path in glob.glob(old + ".data-*"):
            os.remove(path)
'''

namespace: dict = {"np": np}
exec(_VALUES, namespace)  # noqa: S102 - the same values() the child uses
values = namespace["values"]


def _assert_exact(prefix: str, i: int | None = None) -> int:
    with BundleReader(prefix) as reader:
        got = {key: reader.read(key) for key in reader.keys()}
    if i is None:
        i = int(got["b/.ATTRIBUTES/VARIABLE_VALUE"][0])
    expected = values(i)
    assert sorted(got) == sorted(expected), prefix
    for key, value in expected.items():
        assert got[key].tolist() == value.tolist(), (prefix, key, i)
    return i


def _run_trials(directory: str, trials: int, seed: int) -> int:
    rng = random.Random(seed)
    last = 0
    checked: set[int] = set()
    same_values: list[int] = []
    for _ in range(trials):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, directory, str(last)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n", child.stderr.read()
            time.sleep(rng.uniform(0.0, 0.12))  # the random moment of the crash
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        child.stdout.close()
        child.stderr.close()

        log_path = os.path.join(directory, "log")
        logged = []
        if os.path.exists(log_path):
            with open(log_path) as log:
                logged = [int(line) for line in log.read().split()]
        names = os.listdir(directory)
        present = sorted(
            int(n[5:-6]) for n in names if n.startswith("ckpt-") and n.endswith(".index")
        )
        # Every save that returned is committed (unless the loop deleted it: at most i - 4).
        for i in logged:
            if i > logged[-1] - 4:
                assert i in present, (i, present)
        # Every index that exists belongs to a complete, exact checkpoint.
        for i in present:
            if i not in checked:
                _assert_exact(os.path.join(directory, f"ckpt-{i}"), i)
                checked.add(i)
        # The overwritten prefix is absent or holds one save's values, never a mix.
        try:
            same_values.append(_assert_exact(os.path.join(directory, "same")))
        except NotFoundError:
            pass
        # Unfinished saves never leave a prefix that looks like a checkpoint.
        for name in names:
            if name.endswith(".index"):
                assert name.startswith(("ckpt-", "same.")), name
        last = max([last, *logged, *present]) + 1
    return len(checked)


@pytest.mark.slow  # many crash trials: ~46 s here
def test_sigkill_during_save_loop_never_leaves_a_broken_checkpoint(tmp_path) -> None:  # noqa: ANN001
    directory = str(tmp_path)
    # TRACKPOINT_CRASH_TRIALS=1000 turns this into a soak test.
    trials = int(os.environ.get("TRACKPOINT_CRASH_TRIALS", "50"))
    checked = _run_trials(directory, trials=trials, seed=int(os.environ.get("SEED", "7")))
    assert checked >= trials  # the children did commit checkpoints between kills

    # Temporaries of the killed saves are ignored by readers and cleaned by the next save.
    MultiDeviceSaver({None: values(1)}).save(
        os.path.join(directory, "final"), CheckpointOptions(fsync=False)
    )
    assert [n for n in os.listdir(directory) if "_temp_" in n] == []
    _assert_exact(os.path.join(directory, "final"), 1)


_INCREMENTAL_CHILD = '''
import os, sys
import numpy as np
import trackpoint as tp
directory = sys.argv[1]
base = {f"w{k}": np.full((256, 1024), k, np.float32) for k in range(2)}  # 1 MiB each: own files
adapter = np.zeros(16, np.float32)
ckpt = tp.Checkpoint(base=base, adapter=adapter)
manager = tp.CheckpointManager(ckpt, directory, max_to_keep=2)
manager.restore_or_initialize()  # the restored checkpoint is the first baseline
options = tp.CheckpointOptions(incremental=True, fsync=False)
print("ready", flush=True)
while True:
    adapter[:] = int(ckpt.save_counter.numpy()) + 1  # checkpoint N holds N
    manager.save(options=options)
'''


def _assert_incremental(prefix: str, number: int) -> None:
    with BundleReader(prefix) as reader:
        got = {key: reader.read(key) for key in reader.keys()}
    for k in range(2):
        value = got[f"base/w{k}/.ATTRIBUTES/VARIABLE_VALUE"]
        assert value.shape == (256, 1024) and (value == k).all(), (prefix, k)
    assert (got["adapter/.ATTRIBUTES/VARIABLE_VALUE"] == number).all(), prefix
    assert int(got["save_counter/.ATTRIBUTES/VARIABLE_VALUE"]) == number, prefix


@pytest.mark.slow  # many crash trials: ~17 s here
def test_sigkill_during_incremental_manager_saves_keeps_every_checkpoint_valid(tmp_path) -> None:  # noqa: ANN001
    """Hard links, the manager's deletions and restarts (restore, then link from the restored
    checkpoint) at random kill points: every checkpoint that exists reads back exactly, and
    the state file always names one that exists."""
    import trackpoint as tp

    directory = str(tmp_path)
    rng = random.Random(int(os.environ.get("SEED", "11")))
    trials = int(os.environ.get("TRACKPOINT_CRASH_TRIALS", "50")) // 3 + 1
    seen: set[int] = set()
    for _ in range(trials):
        child = subprocess.Popen(
            [sys.executable, "-c", _INCREMENTAL_CHILD, directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n", child.stderr.read()
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        child.stdout.close()
        child.stderr.close()
        present = sorted(
            int(n[5:-6]) for n in os.listdir(directory)
            if n.startswith("ckpt-") and n.endswith(".index")
        )  # fmt: skip
        for number in present:
            _assert_incremental(os.path.join(directory, f"ckpt-{number}"), number)
        latest = tp.latest_checkpoint(directory)
        if latest is not None:
            assert int(latest.rsplit("-", 1)[1]) in present, (latest, present)
        seen.update(present)
    assert len(seen) >= trials  # the children committed checkpoints between kills
    linked = [
        n for n in os.listdir(directory)
        if ".data-" in n and os.stat(os.path.join(directory, n)).st_nlink > 1
    ]  # fmt: skip
    assert linked  # the surviving checkpoints share their frozen files
