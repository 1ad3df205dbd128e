"""What a jax array's bytes do not say: its PRNG key implementation and its ``weak_type``.

A typed PRNG key is stored as its ``key_data`` (uint32), and the data alone does not name the
implementation: ``rbg`` and ``unsafe_rbg`` keys both hold four words. A weakly typed array
(``jnp.asarray(1e-3)``, ``jnp.full(shape, 0.5)``) stores the same bytes as a strong one, but
``bf16_array * it`` stays bfloat16 only while it is weak. So :class:`ArrayLeaf` writes, next to
the value and only when there is something to say, one small JSON value on the array's own
node::

    lr/.ATTRIBUTES/VARIABLE_VALUE   float32[]   the value, as ever
    lr/.ATTRIBUTES/jax_metadata     string      {"weak_type":true}
    rng/.ATTRIBUTES/jax_metadata    string      {"prng_impl":"rbg"}

A DT_STRING scalar under its own attribute name, as ``py_state`` is: ``tf.train.load_checkpoint``
lists it and returns the JSON bytes, and a ``tf.train.Checkpoint`` restoring a ``tf.Variable``
from the node reads ``VARIABLE_VALUE`` and leaves the extra attribute alone. Arrays that are
neither keys nor weak write nothing extra, so their checkpoints are the ones earlier versions
wrote; checkpoints without the value (earlier ones, TensorFlow's) restore as before, the key
implementation then coming from the target.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.graph.keys import JAX_METADATA
from trackpoint.tracking.python_state import bytes_of, string_scalar

__all__ = [
    "JAX_METADATA",
    "ArrayMetadata",
    "decode_metadata",
    "is_key_array",
    "is_key_dtype",
    "key_data_spec",
    "key_impl_name",
    "metadata_of",
    "with_weak_type",
]

logger = logging.getLogger(__name__)

_PRNG_IMPL = "prng_impl"
_WEAK_TYPE = "weak_type"


# dtype -> whether it is a PRNG key dtype: ``jnp.issubdtype`` costs microseconds, and a tree of
# 100,000 leaves has a handful of dtypes (dtypes are hashable and never change meaning).
_key_dtypes: dict[Any, bool] = {}


def is_key_dtype(dtype: Any) -> bool:
    """True for a typed PRNG key dtype (``key<fry>``); answered once per dtype."""
    known = _key_dtypes.get(dtype)
    if known is None:
        known = _key_dtypes[dtype] = bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))
    return known


def is_key_array(value: Any) -> bool:
    """True for a typed PRNG key array (``jax.random.key``), concrete or abstract
    (``jax.ShapeDtypeStruct`` of a key dtype); keys are stored as their ``key_data``."""
    return is_key_dtype(value.dtype)


@dataclass(frozen=True, slots=True)
class ArrayMetadata:
    """What a stored jax array's bytes do not say."""

    prng_impl: str | None = None
    """The key implementation's name (``"threefry2x32"``, ``"rbg"``, ...) for a PRNG key."""
    weak_type: bool = False
    """Whether the array was weakly typed."""

    def to_value(self) -> np.ndarray:
        """The stored form: a DT_STRING scalar holding compact JSON."""
        fields: dict[str, Any] = {}
        if self.prng_impl is not None:
            fields[_PRNG_IMPL] = self.prng_impl
        if self.weak_type:
            fields[_WEAK_TYPE] = True
        return string_scalar(json.dumps(fields, separators=(",", ":")).encode("utf-8"))


def metadata_of(array: jax.Array) -> ArrayMetadata | None:
    """The metadata to store with ``array``, or None when its bytes say everything."""
    if is_key_array(array):
        return ArrayMetadata(prng_impl=key_impl_name(array))
    if getattr(array, "weak_type", False):
        return ArrayMetadata(weak_type=True)
    return None


def decode_metadata(value: Any, *, prefix: str, key: str) -> ArrayMetadata:
    """The :class:`ArrayMetadata` a stored value holds; unknown fields are ignored (a newer
    writer may add some).

    Raises:
        DataLossError: the value is not the JSON object :meth:`ArrayMetadata.to_value` writes.
    """
    try:
        fields = json.loads(bytes_of(value).decode("utf-8"))
        if not isinstance(fields, dict):
            raise TypeError(f"a JSON {type(fields).__name__}, not an object")
        impl = fields.get(_PRNG_IMPL)
        weak = fields.get(_WEAK_TYPE, False)
        if not (impl is None or isinstance(impl, str)) or not isinstance(weak, bool):
            raise TypeError(f"{_PRNG_IMPL} must be a string and {_WEAK_TYPE} a boolean")
    except (InvalidArgumentError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise DataLossError(
            f"{key} in {prefix} is not a jax array's metadata ({exc}); was the checkpoint "
            "written by another program under that key?",
            path=prefix,
            key=key,
        ) from exc
    return ArrayMetadata(prng_impl=impl, weak_type=weak)


def key_impl_name(keys: Any) -> str:
    """The implementation name of a key array or an abstract key (``ShapeDtypeStruct``)."""
    if isinstance(keys, jax.Array):
        return str(jax.random.key_impl(keys))
    # jax.random.key_impl wants an array: ask it about a traced one (nothing is computed).
    found: list[str] = []
    jax.eval_shape(lambda k: found.append(str(jax.random.key_impl(k))), keys)
    return found[0]


def key_data_spec(keys: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of the ``key_data`` of a key array or abstract key (what is stored)."""
    spec: jax.ShapeDtypeStruct = jax.eval_shape(jax.random.key_data, keys)
    return spec


def with_weak_type(array: jax.Array) -> jax.Array:
    """``array`` made weakly typed, on the same sharding.

    JAX has no public way to make a weak array from stored bytes (every constructor from data
    gives a strong one); this uses the conversion ``jax.grad`` uses for the same purpose. If a
    JAX version lacks it the array stays strong, with a warning.
    """
    try:
        from jax._src.lax import lax as lax_internal

        convert = lax_internal._convert_element_type
    except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX version
        logger.warning(
            "this JAX version offers no way to restore weak_type=True; the restored array "
            "of shape %s and dtype %s is strongly typed",
            array.shape,
            array.dtype,
        )
        return array
    weak = convert(array, np.dtype(array.dtype), weak_type=True)
    # The conversion may respell the sharding (P() as P(None,)); put it back as given.
    placed: jax.Array = jax.device_put(weak, array.sharding)
    return placed
