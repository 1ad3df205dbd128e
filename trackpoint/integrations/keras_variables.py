"""Keras variables, layers and optimizers as nodes of the object graph.

* ``keras.Variable`` → :class:`VariableAdapter`: saved as a numpy array of its own dtype
  (bfloat16 included), restored with ``variable.assign``;
* ``keras.Layer`` (models too) and ``keras.optimizers.Optimizer`` → :class:`VariableTree`:
  the object's variables named by ``variable.path`` relative to the object's name, one node
  per path segment, so ``sequential/dense/kernel`` of model ``sequential`` is ``dense/kernel``.

Importing this module registers the adapters; ``trackpoint.integrations.keras`` imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import keras
import ml_dtypes
import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import register_adapter, to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = [
    "EPOCH_NAME",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "VariableAdapter",
    "VariableTree",
    "variables_by_path",
]

MODEL_NAME = "model"
"""Local name of the model's variables under the checkpoint's root."""
OPTIMIZER_NAME = "optimizer"
"""Local name of the optimizer's variables under the checkpoint's root."""
EPOCH_NAME = "epoch"
"""Local name of the number of completed epochs (an int64 variable) under the root."""


def _numpy_dtype(dtype: str) -> np.dtype[Any]:
    name = str(keras.backend.standardize_dtype(dtype))
    found = getattr(ml_dtypes, name, None) if name.startswith(("bfloat", "float8")) else None
    return np.dtype(found if found is not None else name)


class VariableAdapter(Trackable):
    """Adapter: a ``keras.Variable`` as a checkpoint variable; restore calls ``assign``.

    The value is read (a device-to-host copy for accelerator backends) when the checkpoint
    is written; restoring checks shape and dtype before anything is assigned.
    """

    def __init__(self, variable: keras.Variable) -> None:
        self._variable = variable

    @property
    def variable(self) -> keras.Variable:
        return self._variable

    def __repr__(self) -> str:
        variable = self._variable
        return f"<keras variable {variable.path!r} {variable.dtype} {list(variable.shape)}>"

    def _value(self) -> np.ndarray:
        variable = self._variable
        array = np.asarray(keras.ops.convert_to_numpy(variable.value))
        expected = _numpy_dtype(variable.dtype)
        # A backend may hand out a wider type (bfloat16 as float32): narrowing back is exact.
        return array if array.dtype == expected else array.astype(expected)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: self._value}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        variable = self._variable
        saved = np.asarray(restored_tensors[VARIABLE_VALUE_KEY])
        shape = tuple(int(d) for d in variable.shape)
        if saved.shape != shape:
            raise InvalidArgumentError(
                f"Received incompatible tensor with shape {saved.shape} when attempting to "
                f"restore keras variable {variable.path!r} with shape {shape}; the checkpoint "
                "does not match the model (build it with the saved architecture)"
            )
        expected = _numpy_dtype(variable.dtype)
        if saved.dtype.newbyteorder("=") != expected:
            raise InvalidArgumentError(
                f"Received tensor of dtype {saved.dtype} when attempting to restore keras "
                f"variable {variable.path!r} of dtype {variable.dtype}; trackpoint does not "
                "cast on restore (create the variable with the saved dtype)"
            )

        def apply() -> None:
            variable.assign(np.array(saved, dtype=expected, copy=True))  # the view dies after

        return apply


class _Node(Trackable):
    """An inner node of a variable tree (``dense`` in ``dense/kernel``)."""

    def __repr__(self) -> str:
        return f"<keras variables {sorted(self._trackable_children())}>"


def _split(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Local names along each path; whole paths when one is a prefix of another."""
    paths = {name: tuple(name.split("/")) for name in names}
    full = set(paths.values())
    if any(not all(path) or any(path[:i] in full for i in range(1, len(path)))
           for path in paths.values()):
        return {name: (name,) for name in paths}
    return paths


class VariableTree(Trackable):
    """Keras variables by path as nested nodes: ``dense/kernel`` is child ``dense``, ``kernel``.

    The variables are asked for on every save and restore (``variables()``), so variables a
    model or optimizer creates later (``build``) are saved too.

    Args:
        variables: returns ``{path: keras.Variable}``.
        what: names the owner in messages (``"model 'sequential'"``).
    """

    def __init__(self, variables: Callable[[], Mapping[str, keras.Variable]], what: str) -> None:
        self._variables = variables
        self._what = what
        self._signature: tuple[tuple[str, int], ...] | None = None
        self._children: dict[str, Trackable] = {}

    def __repr__(self) -> str:
        return f"<keras {self._what}>"

    def _build(self) -> dict[str, Trackable]:
        current = self._variables()
        signature = tuple((name, id(variable)) for name, variable in current.items())
        if signature == self._signature:
            return self._children
        nodes: dict[tuple[str, ...], Trackable] = {}
        children: dict[str, Trackable] = {}
        for name, path in _split(current).items():
            leaf = to_trackable(current[name])
            assert leaf is not None  # keras variables are adapted by this module
            if len(path) == 1:
                children[path[0]] = leaf
                continue
            parent: Trackable | None = None
            for depth in range(1, len(path)):
                node = nodes.get(path[:depth])
                if node is None:
                    node = nodes[path[:depth]] = _Node()
                    if parent is None:
                        children[path[0]] = node
                    else:
                        parent._track_trackable(node, path[depth - 1])
                parent = node
            assert parent is not None
            parent._track_trackable(leaf, path[-1])
        self._signature, self._children = signature, children
        return children

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        return dict(self._build())

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        return (cached_dependencies or self._build()).get(name)


def variables_by_path(
    variables: Iterable[keras.Variable], owner: str, *, what: str
) -> dict[str, keras.Variable]:
    """``{path relative to owner: variable}``: ``sequential/dense/kernel`` → ``dense/kernel``.

    Raises:
        InvalidArgumentError: two variables have the same path (layers named alike).
    """
    prefix = f"{owner}/"
    found: dict[str, keras.Variable] = {}
    for variable in variables:
        path = variable.path
        name = path[len(prefix):] if path.startswith(prefix) else path
        if name in found and found[name] is not variable:
            raise InvalidArgumentError(
                f"{what} has two variables with the path {path!r}, so a checkpoint cannot tell "
                "them apart; give the layers (or variables) unique names"
            )
        found[name] = variable
    return found


def _layer_tree(layer: keras.Layer) -> VariableTree:
    what = f"{type(layer).__name__} {layer.name!r}"
    return VariableTree(lambda: variables_by_path(layer.variables, layer.name, what=what), what)


def _optimizer_tree(optimizer: keras.optimizers.Optimizer) -> VariableTree:
    what = f"optimizer {optimizer.name!r}"
    return VariableTree(
        lambda: variables_by_path(optimizer.variables, optimizer.name, what=what), what
    )


register_adapter(keras.Variable, VariableAdapter)
register_adapter(keras.Layer, _layer_tree)
register_adapter(keras.optimizers.Optimizer, _optimizer_tree)
