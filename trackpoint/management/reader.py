"""``CheckpointReader``: TensorFlow's ``py_checkpoint_reader`` API over :class:`BundleReader`.

What ``tf.train.load_checkpoint`` returns: values by checkpoint key, the shape and dtype maps,
and the object graph. Resolving a directory through the state file happens a layer up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trackpoint._types import PathLike
from trackpoint.bundle.dtypes import DataType
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.graph.walk import parse_object_graph

if TYPE_CHECKING:
    from typing_extensions import Self

    from trackpoint.storage.base import Storage

__all__ = ["CheckpointReader"]


def _check_key(key: object) -> str:
    """``key`` if it is a str; checkpoint keys are text (``name/.ATTRIBUTES/VARIABLE_VALUE``)."""
    if not isinstance(key, str):
        raise InvalidArgumentError(
            f"key must be a str checkpoint key such as 'w/.ATTRIBUTES/VARIABLE_VALUE', got "
            f"{type(key).__name__}: {key!r:.80}"
        )
    return key


class CheckpointReader:
    """Read tensors of the checkpoint at ``prefix`` by checkpoint key.

    Example::

        with CheckpointReader("/tmp/ckpt-1") as reader:
            for key, shape in reader.get_variable_to_shape_map().items():
                print(key, shape, reader.get_tensor(key).dtype)

    Raises (constructor):
        NotFoundError: ``prefix.index`` does not exist.
        DataLossError: the index is damaged.
    """

    def __init__(self, prefix: PathLike, *, storage: Storage | None = None) -> None:
        self._bundle = BundleReader(prefix, storage=storage)

    @property
    def bundle(self) -> BundleReader:
        """The underlying :class:`BundleReader` (zero-copy reads, slices, verify)."""
        return self._bundle

    @property
    def prefix(self) -> str:
        return self._bundle.prefix

    def keys(self) -> list[str]:
        """Every checkpoint key, sorted by UTF-8 bytes (slice entries hidden)."""
        return self._bundle.keys()

    def has_tensor(self, key: str) -> bool:
        """Whether the checkpoint holds a tensor under ``key``.

        Raises:
            InvalidArgumentError: ``key`` is not a str.
        """
        return self._bundle.has_tensor(_check_key(key))

    def get_tensor(self, key: str) -> np.ndarray:
        """A new array holding tensor ``key`` (strings: object array of bytes).

        Raises:
            NotFoundError: no such key, or a data file is missing.
            DataLossError: the stored bytes are damaged.
            InvalidArgumentError: ``key`` is not a str.
        """
        return self._bundle.read(_check_key(key))

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        """``{checkpoint key: shape as a list}``, as TensorFlow returns it."""
        return {key: list(self._bundle.shape(key)) for key in self._bundle.keys()}

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        """``{checkpoint key: numpy dtype}`` (object for strings)."""
        return {key: self._bundle.dtype(key) for key in self._bundle.keys()}

    def object_graph(self) -> TrackableObjectGraph | None:
        """The parsed object graph, or ``None`` for a checkpoint without one (TF1 style).

        Raises:
            DataLossError: the graph tensor is not a scalar string or does not parse.
        """
        if not self._bundle.has_tensor(OBJECT_GRAPH_KEY):
            return None
        if (
            self._bundle.datatype(OBJECT_GRAPH_KEY) != DataType.DT_STRING
            or self._bundle.shape(OBJECT_GRAPH_KEY) != ()
        ):
            raise DataLossError(
                f"{OBJECT_GRAPH_KEY} in {self.prefix} is not a scalar string",
                path=self.prefix,
                key=OBJECT_GRAPH_KEY,
            )
        # A scalar string: .item() is the bytes object itself.
        return parse_object_graph(self._bundle.read(OBJECT_GRAPH_KEY).item(), prefix=self.prefix)

    def close(self) -> None:
        self._bundle.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
