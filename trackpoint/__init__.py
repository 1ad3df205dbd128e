"""trackpoint: TensorFlow-compatible object-based checkpointing without TensorFlow.

``import trackpoint as tp`` gives the public API of DESIGN.md: ``tp.Checkpoint``,
``tp.CheckpointManager``, ``tp.Variable`` and the inspection helpers. Framework integrations
(PyTorch, JAX, numpy generators) load themselves the first time a checkpoint meets one of their
objects, so importing trackpoint never imports torch or jax; ``tp.jax`` imports jax on first use.

``dir(trackpoint)`` lists that API only, ``__all__`` and the lazily imported framework modules:
the layers' subpackages (``trackpoint.storage``, ``trackpoint.bundle``, …), which importing the
API makes attributes of the package, stay importable but are not offered as its API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trackpoint import errors, metrics
from trackpoint import integrations as _integrations  # noqa: F401  (registers the adapters)
from trackpoint.checkpoint import Checkpoint, LoadStatus
from trackpoint.graph import list_objects
from trackpoint.management import (
    CheckpointManager,
    get_checkpoint_state,
    latest_checkpoint,
    list_variables,
    load_checkpoint,
    load_variable,
    object_metadata,
)
from trackpoint.saving import CheckpointOptions, register_checkpoint_saver, sharding
from trackpoint.tracking import AutoTrackable, ParallelVariable, PythonState, Trackable, Variable

__version__ = "0.1.0"

__all__ = [
    "AutoTrackable",
    "Checkpoint",
    "CheckpointManager",
    "CheckpointOptions",
    "LoadStatus",
    "ParallelVariable",
    "PythonState",
    "Trackable",
    "Variable",
    "__version__",
    "errors",
    "get_checkpoint_state",
    "latest_checkpoint",
    "list_objects",
    "list_variables",
    "load_checkpoint",
    "load_variable",
    "metrics",
    "object_metadata",
    "register_checkpoint_saver",
    "sharding",
]

_LAZY_MODULES = {
    "accelerate": "trackpoint.integrations.accelerate",
    "jax": "trackpoint.integrations.jax",
    "keras": "trackpoint.integrations.keras",
    "lightning": "trackpoint.integrations.lightning",
    "torch": "trackpoint.integrations.torch",
    "transformers": "trackpoint.integrations.transformers",
}


if TYPE_CHECKING:
    from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    """``tp.jax`` (and ``tp.torch``) import their framework only when first used."""
    if name in _LAZY_MODULES:
        import importlib

        module = importlib.import_module(_LAZY_MODULES[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'trackpoint' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API only (PEP 562): ``__all__`` and the lazily imported framework modules."""
    return sorted([*__all__, *_LAZY_MODULES])


# Bindings this module's own code used, not API: deleted so that ``tp.TYPE_CHECKING`` does not
# resolve either (``annotations`` is the ``__future__`` import's binding).
del TYPE_CHECKING, annotations
