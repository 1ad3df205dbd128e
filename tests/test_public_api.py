"""The public API is exactly DESIGN.md's list: nothing missing, nothing leaked.

STYLE §2: ``trackpoint/__init__.py`` sets ``__all__`` to DESIGN.md's names and a test pins it,
sorted and complete; the user-facing submodules ``tp.sharding``, ``tp.metrics`` and
``tp.errors`` are pinned the same way, so plumbing the layers share never becomes de facto API.
"""

from __future__ import annotations

import subprocess
import sys
import types

import trackpoint as tp

# DESIGN.md "Public API", in its order.
DESIGN_NAMES = [
    "Variable",
    "Trackable",
    "AutoTrackable",
    "PythonState",
    "Checkpoint",
    "LoadStatus",
    "CheckpointOptions",
    "CheckpointManager",
    "latest_checkpoint",
    "get_checkpoint_state",
    "load_checkpoint",
    "list_variables",
    "load_variable",
    "object_metadata",
    "list_objects",
    "sharding",
    "register_checkpoint_saver",
    "ParallelVariable",
    "metrics",
    "errors",
    "__version__",
]

# Imported on first attribute access (DESIGN.md: "lazily imported framework modules").
LAZY_MODULES = ["accelerate", "jax", "keras", "lightning", "torch", "transformers"]

# What a user writes a sharding policy against: the two policies, their base class, the input
# a policy receives and the shard it returns. Validation and naming helpers stay internal.
SHARDING_NAMES = [
    "MaxShardSizePolicy",
    "Shard",
    "ShardByTaskPolicy",
    "ShardableTensor",
    "ShardingPolicy",
]

# Reading figures (snapshot/reset and the names to index a snapshot by, the bucket bounds),
# exporting them (Prometheus, OpenTelemetry, or any system through REGISTRY.add_listener with
# a Listener receiving a Figure and a LabelKey), and the records progress events carry. The
# recording functions (begin_write, record_write, increment, ...) stay in
# trackpoint.metrics.registry.
METRICS_NAMES = [
    "BYTES_BUCKETS",
    "BYTES_READ",
    "BYTES_WRITTEN",
    "CHECKPOINT_SIZE",
    "CHECKSUM_FAILURES",
    "READ_DURATION",
    "SECONDS_BUCKETS",
    "SHARDING_POLICY_DURATION",
    "SHARDS_WRITTEN",
    "TRAINING_TIME_BETWEEN_WRITES",
    "WRITE_DURATION",
    "REGISTRY",
    "Registry",
    "Figure",
    "LabelKey",
    "Listener",
    "ReadStats",
    "WriteStats",
    "register_opentelemetry",
    "register_prometheus",
    "reset",
    "snapshot",
]

ERROR_NAMES = [
    "CheckpointError",
    "CollectiveError",
    "DataLossError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
]


def test_all_is_design_md_list() -> None:
    assert sorted(tp.__all__) == sorted(DESIGN_NAMES)
    assert len(set(tp.__all__)) == len(tp.__all__)
    for name in tp.__all__:
        assert getattr(tp, name) is not None, name


def test_no_name_leaks_from_the_package() -> None:
    # Submodules become attributes of a package as they are imported; anything else public
    # must be in __all__ (e.g. a stray ``from typing import Any`` would show up here).
    leaked = [
        name
        for name in dir(tp)
        if not name.startswith("_")
        and name != "annotations"  # the __future__ feature
        and not isinstance(getattr(tp, name), types.ModuleType)
        and name not in tp.__all__
    ]
    assert leaked == []


def test_dir_lists_the_public_api_only() -> None:
    # What tab completion and help() offer: the layers' subpackages that importing the API
    # makes attributes (tp.storage, tp.bundle, ...) and the module's own helpers are not API.
    assert dir(tp) == sorted(DESIGN_NAMES + LAZY_MODULES)
    for helper in ("typing", "TYPE_CHECKING", "annotations"):
        assert not hasattr(tp, helper), helper
    assert tp.storage.__name__ == "trackpoint.storage"  # still reachable, only not listed


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from trackpoint import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(DESIGN_NAMES)


def test_sharding_exports_user_facing_names_only() -> None:
    assert sorted(tp.sharding.__all__) == sorted(SHARDING_NAMES)
    for name in ("validate_shards", "policy_description"):
        assert not hasattr(tp.sharding, name), name
    assert callable(tp.sharding.MaxShardSizePolicy)
    assert isinstance(tp.sharding.ShardByTaskPolicy(), tp.sharding.ShardingPolicy)


def test_metrics_exports_user_facing_names_only() -> None:
    assert sorted(tp.metrics.__all__) == sorted(METRICS_NAMES)
    for name in ("begin_write", "end_blocking", "record_write", "record_duration", "increment",
                 "set_gauge", "timed", "WriteTiming"):  # fmt: skip
        assert not hasattr(tp.metrics, name), name
    assert isinstance(tp.metrics.REGISTRY, tp.metrics.Registry)
    assert tp.metrics.snapshot() == tp.metrics.REGISTRY.snapshot()


def test_errors_exports_every_exception() -> None:
    assert sorted(tp.errors.__all__) == sorted(ERROR_NAMES)
    assert issubclass(tp.errors.NotFoundError, FileNotFoundError)
    assert issubclass(tp.errors.InvalidArgumentError, ValueError)


def test_framework_modules_are_lazy_and_not_in_all() -> None:
    assert sorted(tp._LAZY_MODULES) == LAZY_MODULES
    assert not set(LAZY_MODULES) & set(tp.__all__)


def test_import_is_light_and_tp_jax_loads_on_demand() -> None:
    code = (
        "import sys, trackpoint as tp\n"
        "assert 'jax' not in sys.modules and 'torch' not in sys.modules, 'eager import'\n"
        "assert not {'transformers', 'accelerate'} & set(sys.modules), 'eager HF import'\n"
        "assert 'pytest' not in sys.modules, 'trackpoint.testing imported by the package'\n"
        "assert callable(tp.jax.restore)\n"
        "assert 'jax' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
