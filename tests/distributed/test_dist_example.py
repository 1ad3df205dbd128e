"""examples/torchrun_train.py runs under torchrun, and a resumed run continues exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jobs
import numpy as np
import pytest

pytest.importorskip("torch")

import trackpoint as tp  # noqa: E402
from trackpoint.management.state_file import write_checkpoint_state  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchrun_train.py"


def torchrun(nproc: int, *args: str) -> str:
    command = [
        str(Path(sys.executable).with_name("torchrun")), "--standalone",
        f"--nproc_per_node={nproc}", str(EXAMPLE), "--vocab", "50", "--dim", "8", *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=jobs.JOB_SECONDS, env=env
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"TIMED OUT UNDER LOAD (not a wrong result): torchrun after "
                    f"{jobs.JOB_SECONDS:g} s\n{exc.stdout!r}\n{exc.stderr!r}", pytrace=False)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout


def losses(output: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"step (\d+): loss (\S+),", output)}


@pytest.mark.slow  # trains on 2 gloo ranks, resumes on 1: ~85 s
def test_example_trains_on_2_ranks_and_resumes_on_1(tmp_path: Path) -> None:
    directory = str(tmp_path / "run")
    first = torchrun(2, "--dir", directory, "--steps", "6", "--save-every", "3")
    assert sorted(losses(first)) == [3, 6]
    reader = tp.load_checkpoint(f"{directory}/ckpt-1")
    weight = "model/embedding/weight/.ATTRIBUTES/VARIABLE_VALUE"
    assert reader.get_variable_to_shape_map()[weight] == [50, 8]  # the whole embedding
    assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
    assert np.isfinite(reader.get_tensor(weight)).all()

    # Resume from step 3 on one rank, saving in the background: the same losses follow.
    write_checkpoint_state(directory, f"{directory}/ckpt-1", [f"{directory}/ckpt-1"])
    second = torchrun(1, "--dir", directory, "--steps", "6", "--save-every", "3", "--async-save")
    assert "at step 3 on 1 ranks" in second
    assert losses(second) == {6: losses(first)[6]}
    assert tp.latest_checkpoint(directory) == f"{directory}/ckpt-2"
