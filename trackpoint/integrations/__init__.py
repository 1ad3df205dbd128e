"""Framework adapters: torch, jax, numpy generators (and the trainer plug-ins above them).

Importing this package registers each integration lazily: its module (and its framework) is
imported only when a checkpoint first meets one of the framework's objects, so
``import trackpoint`` never imports torch or jax.
"""

from __future__ import annotations

from trackpoint.tracking.adapters import register_lazy_integration

__all__: list[str] = []

register_lazy_integration("torch", "trackpoint.integrations.torch")
register_lazy_integration("numpy.random", "trackpoint.integrations.numpy_random")
register_lazy_integration("jax", "trackpoint.integrations.jax", structures=True)
register_lazy_integration("jaxlib", "trackpoint.integrations.jax")
register_lazy_integration("keras", "trackpoint.integrations.keras")
