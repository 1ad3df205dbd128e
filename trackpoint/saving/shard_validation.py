"""Checks on what a sharding policy returned, and how a policy is named in figures and errors.

A policy may only regroup the tensors it is given (semantics H3): :func:`validate_shards` runs
after every policy call, before anything is written, and names the first tensor that was added,
lost, duplicated, re-shaped, re-typed or moved to another task. Used by the savers
(:mod:`trackpoint.saving.saver`, the distributed saver); not part of ``tp.sharding``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.saving.devices import DeviceValue, task_of
from trackpoint.saving.sharding import Shard, ShardableTensor

__all__ = ["policy_description", "validate_shards"]


def policy_description(policy: Callable[..., Any]) -> str:
    """``policy.description`` if it has one, else its qualified name (plain functions)."""
    description = getattr(policy, "description", None)
    if isinstance(description, str):
        return description
    return getattr(policy, "__qualname__", type(policy).__qualname__)


def validate_shards(
    shards_by_task: Mapping[str, Sequence[Shard]],
    shardable_tensors: Sequence[ShardableTensor],
    description: str,
) -> None:
    """Check that a policy only regrouped its input (semantics H3).

    Args:
        shards_by_task: the shards the policy returned, under the task it was called for.
        shardable_tensors: every task's input to the policy.
        description: the policy's description, quoted in errors.

    Raises:
        InvalidArgumentError: a (checkpoint key, slice spec) was added, lost, duplicated,
            re-shaped, re-typed, or placed in another task's shard; the message names it.
    """
    unseen: dict[tuple[str, str], ShardableTensor] = {}
    for st in shardable_tensors:
        unseen[(st.checkpoint_key, st.slice_spec)] = st
    originals = dict(unseen)
    seen: set[tuple[str, str]] = set()
    where = f"after running the sharding policy ({description!r})"

    for task, shards in shards_by_task.items():
        for shard in shards:
            for key, slices in shard.items():
                for raw_spec, value in slices.items():
                    spec = raw_spec.strip()
                    ident = f"checkpoint key {key!r}, slice spec {spec!r}"
                    if (key, spec) in seen:
                        raise InvalidArgumentError(
                            f"{where}, several tensors have {ident}; each may appear in exactly "
                            "one shard",
                            key=key,
                        )
                    original = originals.get((key, spec))
                    if original is None:
                        raise InvalidArgumentError(
                            f"{where}, a tensor that is not in the object graph appeared: "
                            f"{ident}. A policy may only regroup the tensors it is given.",
                            key=key,
                        )
                    if original.task != task:
                        raise InvalidArgumentError(
                            f"{where}, the tensor with {ident} of task {original.task!r} was "
                            f"placed in a shard of task {task!r}; shards may not mix tasks",
                            key=key,
                        )
                    _check_same_value(original, value, where, ident)
                    seen.add((key, spec))
                    del unseen[(key, spec)]

    if unseen:
        missing = "; ".join(f"checkpoint key {k!r}, slice spec {s!r}" for k, s in unseen)
        raise InvalidArgumentError(
            f"{where}, tensors of the object graph are missing from the shards: {missing}",
            key=next(iter(unseen))[0],
        )


def _check_same_value(original: ShardableTensor, value: Any, where: str, ident: str) -> None:
    array = value
    if isinstance(value, DeviceValue):
        array = value.value
        if task_of(value.device) != original.task:
            raise InvalidArgumentError(
                f"{where}, the tensor with {ident} moved from task {original.task!r} "
                f"to task {task_of(value.device)!r}",
                key=original.checkpoint_key,
            )
    shape = tuple(getattr(array, "shape", ()))
    if shape != tuple(original.shape):
        raise InvalidArgumentError(
            f"{where}, the tensor with {ident} changed shape from {list(original.shape)} to "
            f"{list(shape)}",
            key=original.checkpoint_key,
        )
    dtype = getattr(array, "dtype", None)
    if dtype is None or np.dtype(dtype) != original.dtype:
        raise InvalidArgumentError(
            f"{where}, the tensor with {ident} changed dtype from {original.dtype} to {dtype}",
            key=original.checkpoint_key,
        )
