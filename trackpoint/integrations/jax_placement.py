"""Putting many restored host arrays on devices at once, and what a sharding says, asked once.

A restore of a pytree builds one jax array per leaf. ``jax.device_put`` spends tens of
microseconds of Python per array (abstract values, sharding checks, result handlers), also
when given a list: as of JAX 0.10 its batched form loops over the arrays in Python too. For a
model of 100,000 small leaves that is seconds, several times the cost of reading and verifying
the bytes. So a restore plans each leaf's :func:`placement` and :func:`place` puts a batch of
whole arrays itself:

* each leaf's abstract value (shape, dtype, ``weak_type``) is made once per distinct triple,
  and what a sharding says (its one device, whether this process holds it) once per distinct
  sharding (a ``SingleDeviceSharding`` is read directly): a model has a handful of each. Saves
  ask :func:`single_device` too (``jax_arrays.py``: a leaf on one local device is saved whole);
* each array is handed to the runtime's own transfer (``batched_device_put``, the call
  ``jax.device_put`` ends in) with ``force_copy``: the device keeps a copy, so the host array
  may be a view of a mapped checkpoint file that is closed afterwards;
* a weakly typed leaf is made weak by its abstract value, with no conversion afterwards.

That transfer is internal to JAX. If a JAX version lacks it, or it refuses a call, the batch
goes through the public ``jax.device_put`` (one call for the list, each array copied first),
with the same results; the fallback is chosen once per process and logged.

Only leaves bound for one local device take this path (the usual single-device and
``SingleDeviceSharding`` targets); a leaf sharded over several devices is assembled from its
shards by the caller (``jax_leaf_targets.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from trackpoint.integrations.jax_metadata import with_weak_type

__all__ = ["Placement", "default_sharding", "place", "placement", "single_device"]

logger = logging.getLogger(__name__)

# sharding -> its one addressable device, or None (several devices, or not this process's):
# shardings are hashable by value; a program uses a handful. Bounded in case one makes many.
_single_devices: dict[jax.sharding.Sharding, Any] = {}
_MAX_CACHED = 4096
# (shape, dtype, weak_type) -> the abstract value of a leaf; a model has a handful.
_avals: dict[tuple[tuple[int, ...], np.dtype[Any], bool], Any] = {}
_default: list[jax.sharding.Sharding] = []
_process: list[int] = []  # this process's index, once asked (after jax.distributed set up)
_lock = threading.Lock()


def default_sharding() -> jax.sharding.Sharding:
    """Where a jax leaf without a sharding goes: the first local device (asked once)."""
    if not _default:
        with _lock:
            if not _default:
                _default.append(jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
    return _default[0]


def _process_index() -> int:
    if not _process:
        _process.append(jax.process_index())
    return _process[0]


def single_device(sharding: jax.sharding.Sharding) -> Any:
    """The one device of ``sharding`` if it has exactly one and this process holds it, else
    None (answered once per distinct sharding)."""
    if type(sharding) is jax.sharding.SingleDeviceSharding:  # most leaves: no hashing
        (device,) = sharding.device_set
        held: Any = device  # jaxlib's Device, untyped
        return device if held.process_index == _process_index() else None
    try:
        return _single_devices[sharding]
    except KeyError:
        pass
    devices = sharding.device_set
    device = next(iter(devices)) if len(devices) == 1 and sharding.is_fully_addressable else None
    if len(_single_devices) >= _MAX_CACHED:
        _single_devices.clear()
    _single_devices[sharding] = device
    return device


class Placement(NamedTuple):
    """Where one host array goes and what it becomes (made at plan time, see
    :func:`placement`)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    weak: bool
    sharding: jax.sharding.Sharding
    device: Any
    """The sharding's one local device."""
    aval: Any
    """JAX's abstract value of the result, or None: place it through ``jax.device_put``."""


def _runtime_put() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The runtime's transfer and JAX's abstract-value class, or None if this JAX lacks them."""
    try:
        from jax._src import core as jax_core
        from jax._src import lib as jax_lib
    except ImportError:  # pragma: no cover - depends on the JAX version
        return None
    put = getattr(getattr(jax_lib, "xla_client", None), "batched_device_put", None)
    shaped = getattr(jax_core, "ShapedArray", None)
    if put is None or shaped is None:  # pragma: no cover - depends on the JAX version
        return None
    return put, shaped


# [(the runtime's transfer, the abstract-value class)] once known, [None] if this JAX lacks them
# or they refused a call (then every later placement goes through jax.device_put).
_runtime: list[tuple[Callable[..., Any], Callable[..., Any]] | None] = []
_canonical_dtypes: dict[np.dtype[Any], bool] = {}


def _canonical(dtype: np.dtype[Any]) -> bool:
    """True if JAX holds ``dtype`` as it is (64-bit types only with ``jax_enable_x64``)."""
    known = _canonical_dtypes.get(dtype)
    if known is None:
        try:
            known = bool(jax.dtypes.canonicalize_dtype(dtype) == dtype)
        except (TypeError, ValueError):
            known = False
        _canonical_dtypes[dtype] = known
    return known


def placement(
    shape: tuple[int, ...], dtype: np.dtype[Any], weak: bool, sharding: jax.sharding.Sharding
) -> Placement:
    """How :func:`place` puts a host array of ``shape`` and ``dtype`` on ``sharding`` (whose
    one local device :func:`single_device` must name), weakly typed if ``weak``."""
    device = single_device(sharding)
    if not _runtime:
        _runtime.append(_runtime_put())
    runtime = _runtime[0]
    aval = None
    if runtime is not None and device is not None and _canonical(dtype):
        key = (shape, dtype, weak)
        aval = _avals.get(key)
        if aval is None:
            if len(_avals) >= _MAX_CACHED:
                _avals.clear()
            aval = _avals[key] = runtime[1](shape, dtype, weak_type=weak)
    return Placement(shape, dtype, weak, sharding, device, aval)


def place(arrays: Sequence[np.ndarray], placements: Sequence[Placement]) -> list[jax.Array]:
    """``arrays[i]`` as a jax array as ``placements[i]`` says; the device keeps its own copy,
    so the host arrays may be views of a file closed afterwards.

    Raises:
        Exception: whatever ``jax.device_put`` raises for a value it cannot place.
    """
    out: list[Any] = [None] * len(arrays)
    slow: list[int] = []
    runtime = _runtime[0] if _runtime else None
    put = runtime[0] if runtime is not None else None
    for index, (array, where) in enumerate(zip(arrays, placements, strict=True)):
        aval = where.aval
        if put is None or aval is None or array.shape != where.shape or array.dtype != where.dtype:
            slow.append(index)
            continue
        try:  # committed, force_copy
            out[index] = put(aval, where.sharding, [array], [where.device], True, True)
        except (TypeError, AttributeError) as exc:  # a JAX whose internals differ: once
            logger.info("tp.jax.restore places leaves through jax.device_put (%s)", exc)
            _runtime[0] = put = None
            slow.append(index)
    if slow:
        placed = jax.device_put(
            [np.array(arrays[i], copy=True) for i in slow], [placements[i].sharding for i in slow]
        )
        for index, array in zip(slow, placed):
            out[index] = with_weak_type(array) if placements[index].weak else array
    return out
