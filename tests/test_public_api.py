"""The public names of DESIGN.md exist on ``trackpoint`` and stay exported."""

from __future__ import annotations

import subprocess
import sys

import trackpoint as tp

PUBLIC = {
    "AutoTrackable", "Checkpoint", "CheckpointManager", "CheckpointOptions", "LoadStatus",
    "ParallelVariable", "PythonState", "Trackable", "Variable", "errors", "get_checkpoint_state",
    "latest_checkpoint", "list_objects", "list_variables", "load_checkpoint", "load_variable",
    "metrics", "object_metadata", "register_checkpoint_saver", "sharding",
}


def test_design_md_names_are_exported():
    assert PUBLIC <= set(tp.__all__)
    for name in tp.__all__:
        assert getattr(tp, name) is not None
    assert callable(tp.sharding.MaxShardSizePolicy)
    assert callable(tp.sharding.ShardByTaskPolicy)
    assert callable(tp.metrics.snapshot)
    assert issubclass(tp.errors.NotFoundError, FileNotFoundError)
    assert issubclass(tp.errors.InvalidArgumentError, ValueError)


def test_import_is_light_and_tp_jax_loads_on_demand():
    code = (
        "import sys, trackpoint as tp\n"
        "assert 'jax' not in sys.modules and 'torch' not in sys.modules, 'eager import'\n"
        "assert callable(tp.jax.restore)\n"
        "assert 'jax' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
