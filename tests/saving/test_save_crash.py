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
