"""JAX arrays and Python scalars as checkpoint values: shards as slices, overlapped host copies.

A ``jax.Array`` is saved shard by shard: each distinct addressable shard (replica 0 of every
index) becomes one slice of the full tensor, in TF's ``SaveSliceInfo`` form ``"8 4 0,2:0,4"``
(tf-checkpoint-format.md §7), and the saver stores the slices as one partitioned tensor (§8).
Nothing is gathered on one device, and a replicated shard is written once. A single-device or
fully replicated array is an ordinary unsliced tensor, so TensorFlow reads either kind whole.

dtypes: jax's narrow floats and ints are ``ml_dtypes`` types, which the bundle layer maps to
TF DataTypes directly (``bundle/dtypes.py``): bfloat16, the float8 family TF knows, int4/uint4,
int2/uint2 and float4_e2m1fn. float8_e3m4, float8_e4m3 and float8_e8m0fnu have no TF DataType
and are refused when the value is tracked. Typed PRNG keys are saved as their ``key_data``,
their implementation (and a weakly typed array's ``weak_type``) as a small JSON value next to
it (``jax_metadata.py``).

The device-to-host copy of a save overlaps across leaves: ``_serialize_to_tensors`` (and its
batch form ``_serialize_many``, which the graph serializer calls with every leaf of a save)
starts ``copy_to_host_async()`` on every shard and returns callables that wait for it; graph
serialization asks every object for its values before the saver calls any callable, so all
transfers are in flight before the first wait. On CPU the device buffer is host memory, and
no copy is started. A leaf is checked once, when its adapter is made (dtype, once per dtype);
a save asks only what can change between saves: whether the array was deleted (donated), and
what its sharding says (once per distinct sharding).

JAX arrays are immutable, so these adapters cannot be restored in place:
``Checkpoint.read``/``restore`` refuse them and ``tp.jax.restore`` returns new arrays.

Multi-process JAX (``jax.distributed``): a global array that spans processes is saved by
``trackpoint.distributed.DistributedCheckpoint``, which gathers its values inside
:func:`process_group_save`: each process then contributes the replica-0 shards it addresses,
and the coordinator's plan checks that the processes' slices tile the whole array before
anything is written. Outside a process-group save such an array is refused (one process
alone would write a checkpoint holding only its own part).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trackpoint.bundle.dtypes import datatype_for
from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.integrations.jax_metadata import (
    JAX_METADATA,
    is_key_array,
    is_key_dtype,
    metadata_of,
)
from trackpoint.integrations.jax_placement import single_device
from trackpoint.saving.change_tracking import ValueVersion
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.save_check import SaveChecked

__all__ = [
    "ArrayLeaf",
    "ScalarLeaf",
    "check_array",
    "check_storable_dtype",
    "host_value",
    "index_bounds",
    "is_key_array",
    "process_group_save",
    "shard_slices",
]

# Set while a DistributedCheckpoint gathers the values of every process (a context variable,
# not a global: an async save's background thread sees its own).
_process_group_save: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trackpoint_jax_process_group_save", default=False
)


@contextlib.contextmanager
def process_group_save() -> Iterator[None]:
    """Inside the block, arrays spanning processes are saved as this process's shards.

    Entered by ``trackpoint.distributed`` while every process of a job gathers its values for
    one checkpoint, whose plan then checks that the processes' slices cover every array.
    """
    token = _process_group_save.set(True)
    try:
        yield
    finally:
        _process_group_save.reset(token)

_IMMUTABLE_HINT = (
    "JAX arrays and Python scalars are immutable and cannot be restored in place; get new "
    "values with tp.jax.restore(path, target), e.g. "
    "state = tp.jax.restore(path, {'params': params, 'opt_state': opt_state}); with a "
    "CheckpointManager, state, path = tp.jax.restore_or_initialize(manager)"
)


# dtypes a checkpoint can hold, once known: a tree of 100,000 leaves has a handful of dtypes.
_storable: dict[Any, np.dtype[Any]] = {}


def check_storable_dtype(dtype: Any, *, what: str) -> np.dtype[Any]:
    """``dtype`` as a numpy dtype a TensorFlow checkpoint can hold.

    Raises:
        InvalidArgumentError: no TF DataType exists for it (names ``what``).
    """
    known = _storable.get(dtype)
    if known is not None:
        return known
    np_dtype: np.dtype[Any] = np.dtype(dtype)
    try:
        datatype_for(np_dtype)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{what} has dtype {np_dtype}, which TensorFlow checkpoints cannot store ({exc}). "
            "Cast it (e.g. x.astype(jnp.float32)) or keep it out of the checkpoint"
        ) from exc
    _storable[dtype] = np_dtype
    return np_dtype


def check_array(array: jax.Array, *, what: str, saving: bool = False) -> None:
    """Raise unless ``array`` can be saved: a storable dtype, all shards in this process (or,
    when ``saving`` inside :func:`process_group_save`, a global array of a multi-process job).

    Raises:
        InvalidArgumentError: names ``what`` and the problem.
    """
    if saving and not _process_group_save.get() and not array.is_fully_addressable:
        raise InvalidArgumentError(
            f"{what} (a jax.Array of shape {array.shape}) spans several processes; save it "
            "from every process with trackpoint.distributed.DistributedCheckpoint (one process "
            "alone holds only its own shards)"
        )
    dtype = array.dtype
    if dtype not in _storable and not is_key_dtype(dtype):  # keys: saved as uint32 key_data
        check_storable_dtype(dtype, what=f"{what} (a jax.Array of shape {array.shape})")


def index_bounds(
    index: tuple[slice, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` per dimension of a shard index (``slice(None)`` resolved)."""
    bounds = []
    for item, dim in zip(index, shape):
        start, stop, step = item.indices(dim)
        if step != 1:
            raise InvalidArgumentError(f"shard index {index} has a step; only boxes are stored")
        bounds.append((start, stop))
    return tuple(bounds)


def shard_slices(array: jax.Array) -> list[tuple[TensorSlice | None, jax.Array]]:
    """The distinct shards of ``array`` to save: ``(slice, single-device data)``, by position.

    A ``None`` slice means one shard holds the whole array (saved unsliced). Replicas other
    than replica 0 and empty shards are skipped.

    An array spanning processes (inside :func:`process_group_save`) gives this process's
    replica-0 shards only; a process holding none of them gives an empty list.

    Raises:
        InvalidArgumentError: the array spans processes outside a process-group save.
    """
    check_array(array, what="a checkpointed value", saving=True)
    shape = tuple(array.shape)
    local = array.is_fully_addressable
    if local and (array.size == 0 or len(array.sharding.device_set) == 1):
        return [(None, array)]
    if not array.addressable_shards:  # a global array living on other processes only
        return []
    if array.size == 0 or array.ndim == 0 or array.sharding.is_fully_replicated:
        # Every holder offers the whole value; the distributed plan has it written once.
        return [(None, array.addressable_shards[0].data)]
    by_bounds: dict[tuple[tuple[int, int], ...], jax.Array] = {}
    for shard in array.addressable_shards:
        if shard.replica_id != 0:
            continue
        bounds = index_bounds(shard.index, shape)
        if any(stop <= start for start, stop in bounds):
            continue
        by_bounds.setdefault(bounds, shard.data)
    if len(by_bounds) == 1 and local:
        (bounds, data), = by_bounds.items()
        if all(b == (0, dim) for b, dim in zip(bounds, shape)):
            return [(None, data)]
    return [
        (TensorSlice.from_bounds([s for s, _ in b], [e - s for s, e in b]), data)
        for b, data in sorted(by_bounds.items())
    ]


def host_value(data: jax.Array) -> Callable[[], np.ndarray]:
    """Start copying ``data`` (one device) to host memory; return a callable that waits for it.

    On CPU the result is usually a read-only view of the device buffer (no copy); the saver
    writes from it directly, or copies it for an asynchronous save.
    """
    data.copy_to_host_async()

    def wait() -> np.ndarray:
        return np.asarray(data)

    return wait


def _array_values(tracked: jax.Array) -> dict[str, Any]:
    """What :class:`ArrayLeaf` saves of ``tracked``: its value (whole, or by shards) and, if the
    bytes do not say everything, its metadata.

    The usual leaf, on one device of this process, is saved whole with no shard bookkeeping
    (what a sharding says is asked once per distinct sharding); its copy to host is started
    now, except on CPU, where the device buffer is host memory already.
    """
    if tracked.is_deleted():  # the graph walk names the path before this is reached
        raise FailedPreconditionError(_deleted_message(tracked, "Cannot use a tracked jax.Array"))
    key = is_key_dtype(tracked.dtype)
    array = jax.random.key_data(tracked) if key else tracked
    device = single_device(array.sharding)
    values: dict[str, Any]
    if device is not None:
        if device.platform != "cpu":
            array.copy_to_host_async()
        values = {VARIABLE_VALUE_KEY: functools.partial(np.asarray, array)}
    else:
        shape = tuple(array.shape)
        slices = shard_slices(array)
        if len(slices) == 1 and slices[0][0] is None:
            values = {VARIABLE_VALUE_KEY: host_value(slices[0][1])}
        else:
            values = {
                VARIABLE_VALUE_KEY: {
                    format_slice_spec(shape, tensor_slice): host_value(data)
                    for tensor_slice, data in slices
                    if tensor_slice is not None
                }
            }
    metadata = metadata_of(tracked)
    if metadata is not None:  # a key's implementation, weak_type: not in the bytes
        values[JAX_METADATA] = metadata.to_value()
    return values


def _deleted_message(array: jax.Array, where: str) -> str:
    return (
        f"{where}: the jax.Array there (shape {tuple(array.shape)}, dtype "
        f"{array.dtype}) has been deleted, typically because its buffer was donated to a "
        "jitted function (donate_argnums). Save the arrays the step returned: rebind the entry "
        "(state['w'] = new_w) or checkpoint the new pytree (tp.Checkpoint(state=new_state)); "
        "for a Flax NNX model take nnx.state(model) again after the update."
    )


class ArrayLeaf(SaveChecked, Trackable):
    """Adapter: one ``jax.Array`` saved under ``VARIABLE_VALUE``, sliced by its shards.

    Made by the adapter registry for every jax array a checkpoint reaches; the adapter holds
    the array, so a later save sees the same array (rebind the attribute or the container
    entry to save new values: containers and pytree views look their entries up at each save).

    Raises:
        InvalidArgumentError: the dtype cannot be stored, or the array spans processes.
    """

    def __init__(self, array: jax.Array) -> None:
        check_array(array, what="a checkpointed value")
        self._array = array

    @property
    def array(self) -> jax.Array:
        """The tracked array (never replaced: restoring returns new arrays instead)."""
        return self._array

    def _check_saveable(self, where: str) -> None:
        # docstring inherited
        if self._array.is_deleted():
            raise FailedPreconditionError(_deleted_message(self._array, f"Cannot save {where}"))

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return _array_values(self._array)

    @classmethod
    def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
        """The values of many leaves (as ``_serialize_to_tensors``): every host copy is started
        before the saver waits for any."""
        return [_array_values(leaf._array) for leaf in trackables]  # type: ignore[attr-defined]

    def _value_versions(self) -> dict[str, ValueVersion | None]:
        """Incremental saves: a jax.Array is immutable, so the same array is the same value."""
        return {VARIABLE_VALUE_KEY: ValueVersion(weakref.ref(self._array))}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited: raised before any object of the restore changes
        raise FailedPreconditionError(f"cannot restore a jax.Array in place: {_IMMUTABLE_HINT}")

    def __repr__(self) -> str:
        return f"<ArrayLeaf shape={tuple(self._array.shape)} dtype={self._array.dtype}>"


class ScalarLeaf(Trackable):
    """A Python ``bool``/``int``/``float``/``complex`` or numpy scalar leaf of a pytree.

    Saved as a 0-d array (``int`` as int64, ``float`` as float64, as ``np.asarray`` types them).

    Raises:
        InvalidArgumentError: the value does not fit a fixed-width dtype (e.g. an int >= 2**63).
    """

    # Every scalar leaf saves exactly its one whole value (restoring it in place is refused).
    _whole_value_names = (VARIABLE_VALUE_KEY,)

    def __init__(self, value: Any, *, what: str = "a scalar leaf") -> None:
        try:
            array = np.asarray(value)
        except OverflowError as exc:
            raise InvalidArgumentError(
                f"{what}, the Python int {value}, does not fit in int64 and cannot be stored; "
                "keep it out of the checkpoint or store it as a string"
            ) from exc
        check_storable_dtype(array.dtype, what=f"{what} ({value!r})")
        self._value = value
        self._array = array

    @property
    def value(self) -> Any:
        return self._value

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: self._array}

    @classmethod
    def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
        # docstring inherited
        return [{VARIABLE_VALUE_KEY: leaf._array} for leaf in trackables]  # type: ignore[attr-defined]

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited: raised before any object of the restore changes
        raise FailedPreconditionError(f"cannot restore a scalar in place: {_IMMUTABLE_HINT}")

    def __repr__(self) -> str:
        return f"<ScalarLeaf {self._value!r}>"
