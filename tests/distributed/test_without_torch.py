"""trackpoint.distributed where torch is not installed: numpy slices over a thread group.

Each test runs a fresh interpreter in which ``import torch`` fails, as it does after
``pip install trackpoint`` or ``trackpoint[jax]`` (the jax.distributed case is in
test_jax_processes.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jobs

REPO = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import json, sys, threading
sys.modules["torch"] = None  # `import torch` fails from here on
import numpy as np
import trackpoint as tp
import trackpoint.distributed as tpd
from tests.distributed.thread_ranks import run_ranks

prefix = sys.argv[1]
full = np.arange(24, dtype=np.float32).reshape(4, 6)
out = {}

def save(rank, collective):
    ckpt = tpd.DistributedCheckpoint(
        rows=tpd.Slice(full[2 * rank : 2 * rank + 2].copy(), full.shape, (2 * rank, 0)),
        flat=tpd.FlatSlice(full.ravel()[12 * rank : 12 * rank + 12].copy(), full.shape,
                           12 * rank),
        group=collective,
    )
    return ckpt.write(prefix)

def restore(rank, collective):
    # Another split: columns, each rank three of them; the flat value in two other halves.
    cols = np.zeros((4, 3), np.float32)
    flat = np.zeros(12, np.float32)
    ckpt = tpd.DistributedCheckpoint(
        rows=tpd.Slice(cols, full.shape, (0, 3 * rank)),
        flat=tpd.FlatSlice(flat, full.shape, 12 * (1 - rank)),
        group=collective,
    )
    ckpt.read(prefix).assert_consumed()
    return (bool(np.array_equal(cols, full[:, 3 * rank : 3 * rank + 3]))
            and bool(np.array_equal(flat, full.ravel()[12 * (1 - rank) : 12 * (1 - rank) + 12])))

out["saved"] = [str(r) for r in run_ranks(2, save)]
out["restored"] = [r if isinstance(r, bool) else repr(r) for r in run_ranks(2, restore)]
errors = {}
for name in ("TorchCollective", "mark_sharded", "layout_of", "ShardedTensorVariable",
             "init_sharded_optimizer_state"):
    try:
        getattr(tpd, name)
    except ImportError as exc:
        errors[name] = str(exc)
out["errors"] = errors
try:
    tpd.no_such_name
except AttributeError as exc:
    out["unknown"] = str(exc)
out["loaded"] = sorted(
    name for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] in ("torch", "trackpoint") and "torch" in name
)
print(json.dumps(out))
"""


def test_numpy_slices_save_and_restore_across_ranks_without_torch(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ckpt")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, prefix], cwd=REPO, capture_output=True, text=True,
        timeout=jobs.JOB_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["saved"] == [prefix, prefix], out
    assert out["restored"] == [True, True], out
    assert sorted(out["errors"]) == sorted(
        ["TorchCollective", "mark_sharded", "layout_of", "ShardedTensorVariable",
         "init_sharded_optimizer_state"]
    )
    for name, message in out["errors"].items():
        assert f"trackpoint.distributed.{name} needs torch, which is not installed" in message
        assert "pip install 'trackpoint[torch]'" in message
    assert "has no attribute 'no_such_name'" in out["unknown"]
    assert out["loaded"] == []  # neither torch nor trackpoint's torch modules
