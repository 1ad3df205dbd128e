"""Registered checkpoint savers: objects that write and read their own files (semantics G1).

Some objects need to coordinate how they are saved (a value split over several devices, an
embedding table living in a service). Registering a saver takes them out of the ordinary
``{checkpoint key: array}`` path: every object matching ``predicate`` is handed, together with
the other matches, to ``save_fn``, which writes its own files, and to ``restore_fn`` on restore.

Call order during ``MultiDeviceSaver.save(prefix)``: each registered ``save_fn`` runs first, in
registration order, with ``file_prefix = f"{prefix}-{name}"``; then the ordinary shards are
written. If ``save_fn`` returns prefixes of bundles it wrote (a str or a list of str), those
bundles are merged into ``prefix`` with the ordinary shards, as TensorFlow merges them. During
``restore(prefix)`` each ``restore_fn`` runs after the ordinary values are restored, with
``merged_prefix = prefix``.

Example::

    tp.register_checkpoint_saver(
        "TableSaver",
        predicate=lambda obj: isinstance(obj, Table),
        save_fn=lambda objects, file_prefix: write_tables(objects, file_prefix),
        restore_fn=lambda objects, merged_prefix: read_tables(objects, merged_prefix),
    )
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trackpoint.errors import InvalidArgumentError, NotFoundError

__all__ = [
    "RegisteredSaver",
    "get_registered_saver",
    "get_registered_saver_name",
    "objects_to_restore",
    "register_checkpoint_saver",
    "registered_savers",
    "unregister_checkpoint_saver",
]

logger = logging.getLogger(__name__)

SaveFn = Callable[[Mapping[str, Any], str], Any]
RestoreFn = Callable[[Mapping[str, Any], str], Any]

# TF's rule for registered names (they become part of file names: `<prefix>-<name>`).
_VALID_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


@dataclass(frozen=True, slots=True)
class RegisteredSaver:
    """One registration made by :func:`register_checkpoint_saver`."""

    name: str
    """Unique name; recorded in the object graph and used in file names."""
    predicate: Callable[[Any], bool]
    """True for the objects this saver handles."""
    save_fn: SaveFn
    """``save_fn(objects_by_path_prefix, file_prefix)``; may return bundle prefixes to merge."""
    restore_fn: RestoreFn
    """``restore_fn(objects_by_path_prefix, merged_prefix)``."""
    strict_predicate_restore: bool
    """On restore, a recorded object failing ``predicate`` is an error (True) or skipped."""


# The registry: name -> saver, in registration order. Later registrations are asked first,
# as in TensorFlow, so a more specific saver can override a general one.
_REGISTRY: dict[str, RegisteredSaver] = {}
_LOCK = threading.Lock()


def register_checkpoint_saver(
    name: str,
    predicate: Callable[[Any], bool],
    save_fn: SaveFn,
    restore_fn: RestoreFn,
    strict_predicate_restore: bool = True,
) -> RegisteredSaver:
    """Register functions that save and restore matching objects themselves.

    Args:
        name: unique, non-empty, made of letters, digits, ``.``, ``_`` and ``-`` (it becomes
            part of file names, so no ``/``).
        predicate: called with each trackable; True selects it for this saver.
        save_fn: ``save_fn(objects_by_path_prefix, file_prefix)`` writes the objects' files
            under ``file_prefix`` (``<prefix>-<name>``). It may return the prefixes of bundles it
            wrote (a str or list of str) to have them merged into the checkpoint.
        restore_fn: ``restore_fn(objects_by_path_prefix, merged_prefix)`` restores them.
        strict_predicate_restore: if True, restoring an object that was saved by this saver
            but no longer matches ``predicate`` raises; if False, that object is skipped.

    Returns:
        The registration.

    Raises:
        InvalidArgumentError: bad name, name already registered, or a non-callable argument.
    """
    if not isinstance(name, str) or not _VALID_NAME.match(name):
        raise InvalidArgumentError(
            f"invalid registered saver name {name!r}: use a non-empty name of letters, digits, "
            "'.', '_' and '-' (it becomes part of file names, so no '/')"
        )
    for label, fn in (("predicate", predicate), ("save_fn", save_fn), ("restore_fn", restore_fn)):
        if not callable(fn):
            raise InvalidArgumentError(
                f"the {label} of registered saver {name!r} must be callable, "
                f"got {type(fn).__name__}"
            )
    if not isinstance(strict_predicate_restore, bool):
        raise InvalidArgumentError(
            f"strict_predicate_restore of registered saver {name!r} must be a bool"
        )
    saver = RegisteredSaver(name, predicate, save_fn, restore_fn, strict_predicate_restore)
    with _LOCK:
        if name in _REGISTRY:
            raise InvalidArgumentError(
                f"a checkpoint saver named {name!r} is already registered "
                f"({_REGISTRY[name]!r}); choose another name or unregister it first"
            )
        _REGISTRY[name] = saver
    return saver


def unregister_checkpoint_saver(name: str) -> None:
    """Remove a registration (tests, plugin reloads).

    Raises:
        NotFoundError: no saver is registered under ``name``.
    """
    with _LOCK:
        if _REGISTRY.pop(name, None) is None:
            raise NotFoundError(f"no checkpoint saver is registered under {name!r}")


def registered_savers() -> tuple[RegisteredSaver, ...]:
    """Every registration, oldest first."""
    with _LOCK:
        return tuple(_REGISTRY.values())


def get_registered_saver(name: str) -> RegisteredSaver:
    """The saver registered under ``name``.

    Raises:
        NotFoundError: nothing is registered under ``name`` (e.g. the checkpoint was written
            by a program that registered a saver this one does not).
    """
    with _LOCK:
        saver = _REGISTRY.get(name)
    if saver is None:
        raise NotFoundError(
            f"no checkpoint saver is registered under {name!r}; the checkpoint was written "
            "with it, so register it (register_checkpoint_saver) before restoring"
        )
    return saver


def get_registered_saver_name(obj: Any) -> str | None:
    """Name of the saver for ``obj``: the latest registration whose predicate accepts it."""
    for saver in reversed(registered_savers()):
        if saver.predicate(obj):
            return saver.name
    return None


def objects_to_restore(name: str, objects_by_path: Mapping[str, Any]) -> dict[str, Any]:
    """The objects saver ``name`` should restore, after checking its predicate on each.

    Args:
        name: the saver name recorded in the checkpoint.
        objects_by_path: object path -> live object recorded under that saver.

    Returns:
        ``objects_by_path`` minus the objects failing the predicate of a non-strict saver.

    Raises:
        NotFoundError: ``name`` is not registered.
        InvalidArgumentError: an object fails the predicate of a strict saver.
    """
    saver = get_registered_saver(name)
    selected: dict[str, Any] = {}
    for path, obj in objects_by_path.items():
        if saver.predicate(obj):
            selected[path] = obj
        elif saver.strict_predicate_restore:
            raise InvalidArgumentError(
                f"object {path!r} ({type(obj).__name__}) was saved with the registered saver "
                f"{name!r}, but that saver's predicate rejects it now; restore it into a "
                "matching object, or register the saver with strict_predicate_restore=False "
                "to skip it",
                key=path,
            )
        else:
            logger.info(
                "Skipping restore of %r: registered saver %r does not accept it", path, name
            )
    return selected
