"""``restore_or_initialize``: resume a ``CheckpointManager``'s JAX state (``tp.jax``).

``CheckpointManager.restore_or_initialize`` restores in place, which JAX arrays refuse (they
are immutable). This form restores the manager's latest checkpoint into a new pytree with
:func:`~trackpoint.integrations.jax_restore.restore`, hands it back, and lets the manager set
``save_counter`` to the saved one, so the next ``manager.save()`` continues the numbering.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import SAVE_COUNTER
from trackpoint.integrations.jax_restore import restore
from trackpoint.management.manager import CheckpointManager
from trackpoint.saving.options import CheckpointOptions

__all__ = ["restore_or_initialize"]


def _own_state(checkpoint: Any) -> dict[str, Any]:
    """``{name: value}`` of the keyword arguments a ``tp.Checkpoint`` was given (and rebound)."""
    children = getattr(checkpoint, "_trackable_children", None)
    view = getattr(checkpoint, "object_graph_view", None)
    if children is None or view is None or view.root is not checkpoint:
        raise InvalidArgumentError(
            f"restore_or_initialize(manager) without a target needs the manager's checkpoint to "
            f"be a tp.Checkpoint of keyword arguments, got {type(checkpoint).__name__} (or one "
            "with root=): pass the target, e.g. restore_or_initialize(manager, {'params': "
            "params, 'opt_state': opt_state})"
        )
    return {name: getattr(checkpoint, name) for name in children() if name != SAVE_COUNTER}


def restore_or_initialize(
    manager: CheckpointManager,
    target: Any = None,
    *,
    partial: bool = False,
    options: CheckpointOptions | None = None,
) -> tuple[Any, str | None]:
    """Restore the manager's latest checkpoint into a new pytree, or initialize.

    The JAX form of ``manager.restore_or_initialize()``. With a checkpoint in the manager's
    directory: the tree is read with :func:`~trackpoint.integrations.jax_restore.restore`
    (every check before any value is read), then the checkpoint's ``save_counter`` is set to the
    saved one, so numbering continues after it (``ckpt-4`` after ``ckpt-3``). Without one: the
    manager's ``init_fn`` is called (if any) and ``target`` comes back as it is.

    Without a ``target``, the target is the Checkpoint's own state, ``{name: value}`` for each
    keyword argument of ``tp.Checkpoint(name=value, ...)`` as the attributes hold it now, and the
    restored values are assigned back (``ckpt.name = tree[name]``): the next save writes them.
    With a ``target`` nothing is assigned; rebind what you use before saving.

    Args:
        manager: the ``tp.CheckpointManager`` to resume.
        target: the pytree to mirror (concrete or abstract leaves, as for ``restore``), or
            None for the Checkpoint's own state.
        partial: as for ``restore``: restore what matches.
        options: as for ``restore``; without ``options.storage`` the manager's own storage.

    Returns:
        ``(tree, path)``: the restored pytree and the checkpoint prefix it came from, or
        ``(target, None)`` when there is no checkpoint (the Checkpoint's own state for no
        ``target``).

    Raises:
        InvalidArgumentError: no ``target`` and the checkpoint is not a ``tp.Checkpoint`` of
            keyword arguments; or as for ``restore`` (the checkpoint and the target differ).
        DataLossError: the files are damaged. Nothing is changed: neither ``save_counter``
            nor the Checkpoint's attributes.

    Example:
        >>> ckpt = tp.Checkpoint(params=params, opt_state=opt_state)
        >>> manager = tp.CheckpointManager(ckpt, "/ckpts/run", max_to_keep=3)
        >>> state, path = tp.jax.restore_or_initialize(manager)  # None on the first run
        >>> params, opt_state = state["params"], state["opt_state"]  # also ckpt.params, ...
    """
    checkpoint = manager.checkpoint
    own = target is None
    wanted = _own_state(checkpoint) if own else target
    restored: list[Any] = [wanted]
    options = CheckpointOptions.resolve(options)
    if options.storage is None:  # read through the manager's backend, not one picked again
        options = dataclasses.replace(options, storage=manager.storage)

    def read(prefix: str) -> None:
        restored[0] = restore(prefix, wanted, partial=partial, options=options)

    path = manager.restore_or_initialize(restore_fn=read)
    if own and path is not None:
        for name, value in restored[0].items():
            setattr(checkpoint, name, value)
    return restored[0], path
