"""`Trackable`: an object with named dependencies and, optionally, values of its own.

The object model of TensorFlow's object-based checkpoints (``tensorflow/python/trackable/base.py``):
every object that can be a node of the object graph is a :class:`Trackable`. It names its
children with *local names* (``_track_trackable``) and may save values of its own through
``_serialize_to_tensors``, restoring them with ``_prepare_restore`` (check, then return the step
that applies; the restore engine changes nothing until every object's check passed) or, for
code written against TensorFlow's protocol, ``_restore_from_tensors``.

Deferred restoration lives here as a hook only: a restore that reaches an object whose child does
not exist yet leaves a :class:`DeferredRestoration` in the parent under the child's local name;
attaching the child (``_track_trackable``) or creating a lazily made variable
(``_add_variable``) hands the child to it. The restore machinery that implements the protocol
sits in ``trackpoint.checkpoint`` and this layer never reads files.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from trackpoint.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "VARIABLE_VALUE_KEY",
    "DeferredRestoration",
    "NameBasedRestoration",
    "NotTrackable",
    "Trackable",
    "TrackableReference",
    "batch_hook",
    "has_values",
    "next_restore_uid",
    "register_variable_type",
]

VARIABLE_VALUE_KEY = "VARIABLE_VALUE"
"""Attribute name under which a variable saves its value (tf-checkpoint-format.md §9.3)."""

# Restore uids order restore requests: the most recently *requested* restore wins (semantics
# B4) whatever order the objects appear in. A counter, not a clock, so ties cannot happen.
_restore_uids = itertools.count(1)


def next_restore_uid() -> int:
    """A fresh restore uid, larger than every uid handed out before."""
    return next(_restore_uids)


# The class Trackable._add_variable creates: ``Variable``, a Trackable defined above this module
# (tracking/variable.py), which registers itself there as it registers the ndarray adapter, so
# this module never imports it (no import circle). A one-entry registry (STYLE.md §1).
_variable_types: dict[str, Callable[..., Trackable]] = {}


def register_variable_type(variable_type: Callable[..., Trackable]) -> None:
    """Make ``variable_type`` (called as ``variable_type(value, dtype=, name=)``) the class of
    the variables :meth:`Trackable._add_variable` creates."""
    _variable_types["variable"] = variable_type


class TrackableReference(NamedTuple):
    """One dependency edge: a local name and the child it names."""

    name: str
    ref: Trackable


class DeferredRestoration(Protocol):
    """A checkpoint node waiting for its Python object (implemented by the restore coordinator).

    Objects store these in ``_deferred_dependencies`` under the child's local name and hand
    the child over with :meth:`restore` once it exists.
    """

    @property
    def restore_uid(self) -> int:
        """Order of the restore request; larger is more recent."""
        ...

    def restore(self, trackable: Trackable) -> None:
        """Bind ``trackable`` to the checkpoint node and restore it and its descendants."""
        ...

    def value_spec(self) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
        """``(shape, dtype)`` of the saved value if the node is a plain variable, else None."""
        ...


class NameBasedRestoration(Protocol):
    """A name-based (TF1) restore waiting for *any* child of an object.

    Implemented in ``trackpoint.checkpoint.name_based``; kept in
    ``_name_based_restorations`` and, unlike a :class:`DeferredRestoration`, never used up.
    """

    @property
    def restore_uid(self) -> int:
        """Order of the restore request; larger is more recent."""
        ...

    def restore_child(self, name: str, trackable: Trackable) -> None:
        """Restore ``trackable``, just attached under the local name ``name``, and its subtree."""
        ...


class Trackable:
    """Base class of every object that can be a node of a checkpoint's object graph.

    Dependencies are declared explicitly with :meth:`_track_trackable`; subclass
    :class:`~trackpoint.tracking.AutoTrackable` to track attributes on assignment instead.
    An object saves values of its own by overriding :meth:`_serialize_to_tensors` and
    :meth:`_prepare_restore` (or, without the all-or-nothing guarantee,
    :meth:`_restore_from_tensors`).

    The bookkeeping lives in attributes named ``_self_*``, created on first use, so subclasses
    need not call ``super().__init__()``.
    """

    # Declared for the type checker only: created by _maybe_initialize_trackable on first use.
    _self_dependencies: list[TrackableReference]  # in child order
    _self_dependency_names: dict[str, Trackable]  # local name -> child
    _self_deferred: dict[str, list[DeferredRestoration]]  # local name -> waiting restorations
    # uid of the restore that last assigned values to this object (status assertions compare
    # it with their own uid). A class default, so reading and setting it creates none of the
    # other bookkeeping: a restore of 100,000 variables touches it 100,000 times.
    _self_update_uid: int = -1

    # -- bookkeeping -------------------------------------------------------------------------

    def _maybe_initialize_trackable(self) -> None:
        """Create the dependency bookkeeping (not in ``__init__``: subclasses forget to call it)."""
        if "_self_dependencies" in self.__dict__:
            return
        set_ = object.__setattr__
        set_(self, "_self_dependencies", [])  # list[TrackableReference], in child order
        set_(self, "_self_dependency_names", {})  # local name -> child
        set_(self, "_self_deferred", {})  # local name -> list[DeferredRestoration]

    @property
    def _update_uid(self) -> int:
        return self._self_update_uid

    @_update_uid.setter
    def _update_uid(self, value: int) -> None:
        object.__setattr__(self, "_self_update_uid", value)

    @property
    def _checkpoint_dependencies(self) -> list[TrackableReference]:
        """Every named dependency, in child order."""
        self._maybe_initialize_trackable()
        return list(self._self_dependencies)

    @property
    def _deferred_dependencies(self) -> dict[str, list[DeferredRestoration]]:
        """Restorations waiting for a child of this object to be attached, by local name."""
        self._maybe_initialize_trackable()
        return self._self_deferred

    @property
    def _name_based_restorations(self) -> list[NameBasedRestoration]:
        """Name-based (TF1) restores offered every child attached later, whatever its name.

        As TF's ``_name_based_restores``: a checkpoint without an object graph matches values
        by name, so any new child may have one. Created on first use.
        """
        self._maybe_initialize_trackable()
        restorations: list[NameBasedRestoration] | None = self.__dict__.get("_self_name_based")
        if restorations is None:
            restorations = []
            object.__setattr__(self, "_self_name_based", restorations)
        return restorations

    # -- children ----------------------------------------------------------------------------

    def _trackable_children(self) -> dict[str, Trackable]:
        """This object's children by local name, in child order.

        Override to compute children (tracked containers do); never create new objects here:
        save and restore call it several times and must see the same children.
        """
        self._maybe_initialize_trackable()
        # Each reference is a (name, child) pair: dict() builds the mapping in C.
        return dict(self._self_dependencies)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        """The child named ``name``, or None.

        Override to create children on demand while restoring (e.g. a state container that
        recreates missing attributes).
        """
        if cached_dependencies is not None:
            return cached_dependencies.get(name)
        self._maybe_initialize_trackable()
        return self._self_dependency_names.get(name)

    def _track_trackable(
        self, trackable: Trackable, name: str, overwrite: bool = False
    ) -> Trackable:
        """Declare ``trackable`` a child of this object under the local name ``name``.

        Pending restorations waiting for ``name`` are applied to ``trackable`` at once.

        Args:
            trackable: the child.
            name: its local name; names are part of checkpoint keys, so keep them stable.
            overwrite: replace an existing child of that name silently (attribute assignment
                does); otherwise a second child under one name is an error.

        Returns:
            ``trackable``, so a declaration can be an assignment.

        Raises:
            InvalidArgumentError: ``trackable`` is not a Trackable, ``name`` is not a string,
                or another object is already tracked under ``name`` and ``overwrite`` is off.
        """
        self._maybe_initialize_trackable()
        if not isinstance(trackable, Trackable):
            raise InvalidArgumentError(
                f"_track_trackable() can only track Trackable objects; got {trackable!r} of "
                f"type {type(trackable).__name__} for the name {name!r}"
            )
        if not isinstance(name, str):
            raise InvalidArgumentError(
                f"a local name must be a str, got {name!r} of type {type(name).__name__}"
            )
        current = self._self_dependency_names.get(name)
        reference = TrackableReference(name, trackable)
        if current is not None and current is not trackable:
            if not overwrite:
                raise InvalidArgumentError(
                    f"Called _track_trackable() with name={name!r}, but a Trackable with this "
                    "name is already declared as a dependency. Names must be unique (or pass "
                    "overwrite=True)."
                )
            deps = self._self_dependencies
            for index, old in enumerate(deps):
                if old.name == name:
                    deps[index] = reference
        elif current is None:
            self._self_dependencies.append(reference)
        self._self_dependency_names[name] = trackable
        if current is not trackable:
            self._handle_deferred_dependencies(name, trackable)
        return trackable

    def _track_first_children(self, names: list[str], children: list[Trackable]) -> bool:
        """``_track_trackable(child, name)`` of each pair, in one pass, on an object with no
        children and no waiting restorations yet (a container being built); False, tracking
        nothing, otherwise (the caller then tracks them one by one).

        ``names`` must be distinct strings and ``children`` Trackables.
        """
        state = self.__dict__
        if state.get("_self_dependencies") or state.get("_self_deferred") or state.get(
            "_self_name_based"
        ):
            return False
        self._maybe_initialize_trackable()
        # TrackableReference(name, child) of each pair, built in C (a NamedTuple's __new__ is
        # a Python function).
        references = map(tuple.__new__, itertools.repeat(TrackableReference), zip(names, children))
        self._self_dependencies.extend(references)
        self._self_dependency_names.update(zip(names, children))
        return True

    def _untrack(self, name: str) -> None:
        """Forget the child named ``name`` (no-op if there is none)."""
        self._maybe_initialize_trackable()
        if self._self_dependency_names.pop(name, None) is None:
            return
        deps = self._self_dependencies
        deps[:] = [ref for ref in deps if ref.name != name]

    def _handle_deferred_dependencies(self, name: str, trackable: Trackable) -> None:
        """Apply restorations waiting for a child named ``name`` to ``trackable``.

        The most recently requested restore runs first; older ones then find the object
        already restored by a newer request and leave its values alone (semantics B4).
        Objects that manage children themselves call this when a child appears. If a restore
        fails (a value that does not fit ``trackable``), ``trackable`` is unchanged and the
        restorations keep waiting for a child that fits.
        """
        self._maybe_initialize_trackable()
        named = self.__dict__.get("_self_name_based")
        if not self._self_deferred and not named:
            return  # nothing waits (every child of a new container): no per-child work
        trackable._maybe_initialize_trackable()
        pending = self._self_deferred.pop(name, ())
        ordered = sorted(pending, key=lambda p: p.restore_uid, reverse=True)
        for done, position in enumerate(ordered):
            try:
                position.restore(trackable)
            except BaseException:
                self._self_deferred.setdefault(name, []).extend(ordered[done:])
                raise
        for restoration in sorted(named or (), key=lambda r: r.restore_uid, reverse=True):
            restoration.restore_child(name, trackable)

    def _add_variable(
        self,
        name: str,
        initial_value: Any | Callable[[], Any] = None,
        *,
        dtype: Any = None,
        shape: tuple[int, ...] | None = None,
        overwrite: bool = False,
    ) -> Trackable:
        """Create a variable child named ``name``, restoring it on creation if a restore waits.

        If a pending restore has a value for ``name``, the variable is created with the saved
        shape and the saved value (the initial value is not evaluated); otherwise from
        ``initial_value`` (zeros of ``shape`` if None).

        Returns:
            the new ``trackpoint.Variable`` (typed as a Trackable: ``Variable`` is defined
            above this module).
        """
        import numpy as np

        spec = self._preload_spec(name)
        if spec is not None:
            saved_shape, saved_dtype = spec
            value_dtype = np.dtype(dtype if dtype is not None else saved_dtype)
            # Strings start empty (an object array of zeros is not a string value).
            value: Any = (
                np.full(saved_shape, b"", dtype=object) if value_dtype.kind == "O"
                else np.zeros(saved_shape, dtype=value_dtype)
            )
        elif initial_value is None:
            value = np.zeros(shape or (), dtype=dtype if dtype is not None else np.float32)
        else:
            value = initial_value() if callable(initial_value) else initial_value
        variable = _variable_types["variable"](value, dtype=dtype, name=name)
        new_name = name not in self._self_dependency_names
        try:
            self._track_trackable(variable, name, overwrite=overwrite)
        except BaseException:
            # A waiting restore that fails (a damaged value) must not leave the variable
            # declared: the caller could never create it again ("already declared").
            if new_name and self._self_dependency_names.get(name) is variable:
                self._untrack(name)
            raise
        return variable

    def _preload_spec(self, name: str) -> tuple[tuple[int, ...], Any] | None:
        """Saved ``(shape, dtype)`` for a variable about to be created as ``name``, if pending."""
        self._maybe_initialize_trackable()
        pending = self._self_deferred.get(name, ())
        if not pending:
            return None
        newest = max(pending, key=lambda p: p.restore_uid)
        return newest.value_spec()

    # -- values ------------------------------------------------------------------------------

    def _serialize_to_tensors(self) -> dict[str, Any]:
        """This object's own values to save, by name (no children).

        Values are numpy arrays (or objects an adapter knows how to view as one), a dict
        ``{slice_spec: array}`` for a partitioned value, or a zero-argument callable that
        returns one; a callable is called exactly once per save (semantics G2).
        The default saves nothing.
        """
        return {}

    def _tensor_name_aliases(self) -> Mapping[str, Sequence[str]]:
        """Other attribute names each value may have been saved under (semantics G3).

        An object that renamed a value (say ``"table"`` became ``"table-keys"``) lists the old
        name here, ``{"table-keys": ["table"]}``, and keeps reading checkpoints written before
        the rename; old code that lists the new name reads newer checkpoints. Saving always
        uses the current name. The default has no aliases.
        """
        return {}

    def _optional_tensor_names(self) -> frozenset[str]:
        """Names among :meth:`_serialize_to_tensors`'s that a checkpoint may lack.

        A restore fails when a checkpoint has some of an object's values but not all; names
        listed here are exempt, and are simply absent from ``restored_tensors``. The default
        exempts none.
        """
        return frozenset()

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        """Check that ``{name: array}`` fits this object; return the step that applies it.

        The restore engine calls this for every object of a restore before it changes any
        (trackpoint/saving/restore.py): raise :class:`~trackpoint.errors.InvalidArgumentError`
        here for a value that does not fit, and return a function that only copies, so that a
        failed restore changes nothing. The arrays may be read-only views of the checkpoint
        file, valid until the returned function has run: copy what you keep.

        The default has no checks: its step calls :meth:`_restore_from_tensors`, so subclasses
        written against that method keep working (without the all-or-nothing guarantee).
        """
        return functools.partial(self._restore_from_tensors, restored_tensors)

    def _restore_from_tensors(self, restored_tensors: Mapping[str, Any]) -> None:
        """Restore this object's values from ``{name: array}`` (names as in the save).

        The arrays may be read-only views that are valid only during the call: copy what you
        keep. Raise :class:`~trackpoint.errors.InvalidArgumentError` for a value that does
        not fit, before changing anything. The default runs :meth:`_prepare_restore`'s step
        (objects implement one of the two).
        """
        if type(self)._prepare_restore is Trackable._prepare_restore:
            raise NotImplementedError(
                f"{type(self).__name__} saves values but implements neither _prepare_restore "
                "nor _restore_from_tensors"
            )
        self._prepare_restore(restored_tensors)()


    # -- values, many objects at a time (the batch-first protocol) ------------------------------
    #
    # The engines call these on an object's class with every object of that class in one save or
    # restore, as zarr-python's codecs take ``chunks_and_specs``: the defaults map over the
    # per-object methods above, and a class whose objects are many and alike (variables, torch
    # tensors, JAX leaves) implements the batch form. Engines reach them through
    # :func:`batch_hook`, which keeps a subclass that overrides a per-object method on the
    # per-object path.

    _whole_value_names: ClassVar[tuple[str, ...] | None] = None
    """Set by a class every instance of which saves exactly these value names, each restored
    from one whole stored value (never from slices): the restore walk then plans its objects
    from the checkpoint's attributes without calling ``_serialize_to_tensors``. A value may
    still be a callable or have a device layout at save time; the serializer checks the names
    against what the objects return. None: ask each object."""

    @classmethod
    def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
        """:meth:`_serialize_to_tensors` of many objects of this class, in order."""
        return [trackable._serialize_to_tensors() for trackable in trackables]

    @classmethod
    def _prepare_restores(
        cls,
        trackables: Sequence[Trackable],
        restored: Sequence[Mapping[str, Any]],
        on_error: Callable[[int, InvalidArgumentError], BaseException],
    ) -> Callable[[], None]:
        """:meth:`_prepare_restore` of many objects of this class: check every value, then
        return one step that applies them all, in order.

        Args:
            trackables: the objects.
            restored: ``restored[i]`` is ``{name: array}`` for ``trackables[i]``.
            on_error: the error to raise for object ``i`` whose value does not fit, from
                ``i`` and the :class:`~trackpoint.errors.InvalidArgumentError` its check raised
                (it names the object and the checkpoint key).
        """
        steps: list[Callable[[], None]] = []
        for index, (trackable, values) in enumerate(zip(trackables, restored, strict=True)):
            try:
                steps.append(trackable._prepare_restore(values))
            except InvalidArgumentError as exc:
                raise on_error(index, exc) from exc

        def apply() -> None:
            for step in steps:
                step()

        return apply


_PER_OBJECT = {
    "_serialize_many": ("_serialize_to_tensors",),
    "_prepare_restores": ("_prepare_restore", "_restore_from_tensors"),
    "_whole_value_names": ("_serialize_to_tensors", "_prepare_restore", "_restore_from_tensors"),
}


def batch_hook(cls: type[Trackable], name: str) -> Any:
    """``cls``'s batch hook ``name`` (``_serialize_many``, ``_prepare_restores`` or
    ``_whole_value_names``), or :class:`Trackable`'s default (None for ``_whole_value_names``)
    when a subclass overrides a per-object method below the class that wrote the batch form.

    A class's batch form speaks for its own per-object methods only: a ``Variable`` subclass
    that checks more in ``_prepare_restore`` must not be restored by ``Variable``'s batch.

    Asked once per class per save or restore (the engines group objects by class first), so it
    keeps nothing: a cache keyed on classes would keep classes a program makes and drops alive,
    and would not see a method added to a class after its first save.
    """
    mro = cls.__mro__
    owner = next(index for index, klass in enumerate(mro) if name in vars(klass))
    for method in _PER_OBJECT[name]:
        defined = next((index for index, klass in enumerate(mro) if method in vars(klass)), owner)
        if defined < owner:  # a class below the batch form's owner changed the per-object method
            if name == "_whole_value_names":
                return None
            return vars(Trackable)[name].__get__(None, cls)
    return getattr(cls, name)


class NotTrackable(Trackable):
    """Marker base: objects that must never be checkpointed.

    Saving a checkpoint whose object graph reaches one raises ``NotImplementedError`` naming
    its path (semantics A7), instead of silently writing a checkpoint that cannot restore it.
    Keep such objects out of the graph or assign them through ``NoDependency``.
    """


def has_values(trackable: Trackable) -> bool:
    """True if ``trackable`` saves values of its own (it overrides ``_serialize_to_tensors``)."""
    return type(trackable)._serialize_to_tensors is not Trackable._serialize_to_tensors
