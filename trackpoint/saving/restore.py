"""The value phase of every restore: read and verify every value, then change the objects.

Every restore ends here — ``Checkpoint.read``/``restore`` (through the planner in
:mod:`trackpoint.checkpoint.restore`), deferred restores when an object is attached, name-based
restores, ``tp.jax.restore``, the distributed layer and :meth:`MultiDeviceSaver.restore` —
so one set of rules holds for all of them:

1. every key the objects need is looked up (a missing key fails, naming its object, before any
   object changes — and whatever else failed; the lookup runs only once a read has failed,
   since an absent key fails every read, unless a progress callback asks sizes first);
2. every value is read and its crc32c verified (:meth:`BundleReader.read_many`, slices with
   :meth:`BundleReader.read_slice`); arrays are zero-copy views of the mapped files, so
   verifying first holds no second copy of the state;
3. every object checks its values (shape, dtype, slot shapes, optimizer group sizes, whether
   the target can be written at all: a read-only array, a torch tensor whose elements share
   memory), all objects of one class in one call of ``batch_hook(cls, "_prepare_restores")``
   (:class:`RestoreItem` s and :class:`RestoreBatch` es alike; the default maps
   ``Trackable._prepare_restore``), which returns the step that applies them; registered
   savers are looked up and their strict predicates checked;
4. only then is every object changed, each by copying once from the mapped file. Nothing
   foreseeable can fail here (step 3 checked it), and a SIGINT arriving meanwhile is held
   until the last copy is done, so Ctrl-C never leaves half the objects restored;
5. registered savers' ``restore_fn``s (user code) run last, as in TensorFlow, so they see the
   restored objects; they never run on a checkpoint that failed steps 1–3.

A failure in steps 1–3 leaves every object as it was. Processes restoring one checkpoint
together (the distributed layer) vote between steps 3 and 4 (:class:`RestoreAgreement`): a
process applies its values only if every process verified its own, so a damaged value read by
one process leaves the objects of all of them unchanged. A registered saver's ``restore_fn`` that
fails leaves the built-in objects restored and its own objects as it left them: trackpoint
cannot roll back user code, so a ``restore_fn`` that must be all-or-nothing checks its files
before it changes anything (the one exception to "a restore that raises changed nothing").
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import functools
import itertools
import logging
import math
import operator
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import parse_slice_spec
from trackpoint.errors import CheckpointError, InvalidArgumentError, NotFoundError
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.progress import ProgressEvent, ReadProgress
from trackpoint.saving.registration import get_registered_saver, objects_to_restore
from trackpoint.tracking.base import Trackable, batch_hook
from trackpoint.tracking.value_columns import ValueColumns

__all__ = [
    "RestoreAgreement",
    "RestoreBatch",
    "RestoreItem",
    "agreement_pending",
    "restore_agreement",
    "restore_items",
]

logger = logging.getLogger(__name__)

Label = str | Callable[[], str]
_Step = Callable[[], None]


class RestoreAgreement:
    """A vote among the processes of one restore, between verifying and applying values.

    Args:
        exchange: sends this process's message ("" for success, else what failed) to every
            process and returns all of them (an all-gather); every process calls it once.
    """

    def __init__(self, exchange: Callable[[str], Sequence[str]]) -> None:
        self._exchange = exchange
        self.voted = False

    def vote(self, error: BaseException | None) -> None:
        """Tell the others whether this process verified its values; the first call only.

        Raises:
            CheckpointError: another process failed (this one then applies nothing).
        """
        if self.voted:
            return  # later walks of the same restore (deferred objects) are local
        self.voted = True
        mine = "" if error is None else f"{type(error).__name__}: {error}"
        failed = [message for message in self._exchange(mine) if message]
        if error is None and failed:
            raise CheckpointError(
                f"Another process could not restore its values ({failed[0]}); nothing was "
                "restored here either, so every process keeps the same state."
            )


# The agreement of the restore running in this thread, if it runs together with others: set
# by the distributed layer around its Checkpoint.restore call (a context variable, not a global:
# each thread and task sees its own).
_agreement: contextvars.ContextVar[RestoreAgreement | None] = contextvars.ContextVar(
    "trackpoint_restore_agreement", default=None
)


@contextlib.contextmanager
def restore_agreement(agreement: RestoreAgreement) -> Iterator[RestoreAgreement]:
    """Make the restores run inside the block vote through ``agreement`` before applying."""
    token = _agreement.set(agreement)
    try:
        yield agreement
    finally:
        _agreement.reset(token)


def agreement_pending() -> bool:
    """Whether a restore running now must still vote (it must, even with nothing to read)."""
    agreement = _agreement.get()
    return agreement is not None and not agreement.voted


class RestoreItem(NamedTuple):
    """One object of a restore and where the checkpoint keeps each of its values.

    A named tuple (immutable, and built at a fraction of a frozen dataclass's cost: a restore
    of 100,000 variables builds 100,000 of them).
    """

    trackable: Trackable
    """The object whose ``_prepare_restore`` receives the values."""
    keys: Mapping[str, str]
    """The object's own value name (as in ``_serialize_to_tensors``) -> checkpoint key."""
    label: Label
    """Readable path of the object for messages, or a function computing it (only on error)."""
    layouts: Mapping[str, Any] | None = None
    """Own value name -> the live value, where its layout matters: ``{slice_spec: value}`` for a
    partitioned value (each box is read as a slice). None: every value is read whole."""


class RestoreBatch(NamedTuple):
    """Objects of one class, each restored whole from the checkpoint keys of the same values.

    What the restore walk plans for many alike objects (the variables of a large model, whose
    class declares ``_whole_value_names``): columns of keys instead of one
    :class:`RestoreItem` each, so a restore of 100,000 of them builds no object per value
    before their class's ``_prepare_restores`` receives them.
    """

    objects: Sequence[Trackable]
    """The objects, all of one class."""
    names: tuple[str, ...]
    """The value names each object restores (its own names, as in ``_serialize_to_tensors``)."""
    keys: Sequence[Sequence[str]]
    """``keys[j][i]``: the checkpoint key of value ``names[j]`` of ``objects[i]``."""
    label: Callable[[int], str]
    """Readable path of ``objects[i]``, for messages (called only on error)."""
    position: int = 0
    """How many of the restore's items the walk met before this batch's first object: classes
    are prepared and applied in the order the walk first met an object of theirs."""


_Source = RestoreItem | RestoreBatch


def _in_walk_order(items: Sequence[RestoreItem], batches: Sequence[RestoreBatch]) -> list[_Source]:
    """``items`` with each batch placed before the item at its ``position``."""
    if not batches:
        return list(items)
    ordered = sorted(batches, key=_POSITION)
    merged: list[_Source] = []
    next_batch = 0
    for index, item in enumerate(items):
        while next_batch < len(ordered) and ordered[next_batch].position <= index:
            merged.append(ordered[next_batch])
            next_batch += 1
        merged.append(item)
    merged.extend(ordered[next_batch:])
    return merged


_POSITION = operator.attrgetter("position")


def _label(item: RestoreItem) -> str:
    return item.label if isinstance(item.label, str) else item.label()


def _describe(source: _Source, offset: int) -> tuple[str, Trackable, list[str]]:
    """``(readable path, object, checkpoint keys)`` of object ``offset`` of ``source``."""
    if isinstance(source, RestoreBatch):
        keys = [column[offset] for column in source.keys]
        return source.label(offset), source.objects[offset], keys
    return _label(source), source.trackable, list(source.keys.values())


def _slice_specs(item: RestoreItem, name: str) -> list[str] | None:
    """The non-empty slice specs ``name`` of ``item`` is read as, or None for a whole value."""
    if item.layouts is None:
        return None
    live = item.layouts.get(name)
    if isinstance(live, Mapping) and not isinstance(live, DeviceValue):
        specs = [spec.strip() if isinstance(spec, str) else spec for spec in live]
        if specs and any(specs):
            return specs
    return None


def _first_missing(sources: Sequence[_Source], reader: BundleReader, prefix: str) -> None:
    """Raise NotFoundError for the first key, in walk order, the checkpoint lacks (if any)."""
    has_tensor = reader.has_tensor
    for source in sources:
        if isinstance(source, RestoreBatch):
            for column in source.keys:
                if not all(map(has_tensor, column)):
                    offset = next(i for i, key in enumerate(column) if not has_tensor(key))
                    raise _missing(source, offset, column[offset], prefix)
        else:
            for key in source.keys.values():
                if not has_tensor(key):
                    raise _missing(source, 0, key, prefix)


def _missing(source: _Source, offset: int, key: str, prefix: str) -> NotFoundError:
    label, trackable, _ = _describe(source, offset)
    return NotFoundError(
        f"Key {key} not found in checkpoint {prefix}: the object {label} "
        f"({type(trackable).__name__}) expects it. The checkpoint was written by a program "
        "whose objects differ; restore a matching checkpoint, or give this object the "
        "checkpoint's structure.",
        path=prefix,
        key=key,
    )


def _read_slice(reader: BundleReader, key: str, spec: str) -> np.ndarray:
    parsed = parse_slice_spec(spec)
    assert parsed is not None  # a non-empty spec
    full_shape, tensor_slice = parsed
    stored = reader.shape(key)
    if tuple(stored) != tuple(full_shape):
        raise InvalidArgumentError(
            f"slice spec {spec!r} of checkpoint key {key!r} is for a tensor of shape "
            f"{list(full_shape)}, but the checkpoint {reader.prefix} holds shape {list(stored)}",
            path=reader.prefix,
            key=key,
        )
    return reader.read_slice(key, tensor_slice, copy=False)


def _nbytes(reader: BundleReader, key: str, spec: str | None) -> int:
    shape = reader.shape(key)
    if spec:
        parsed = parse_slice_spec(spec)
        if parsed is not None:
            shape = parsed[1].shape_in(shape)
    return math.prod(shape) * reader.dtype(key).itemsize


class _Values:
    """Every value the sources need, read and verified, in the order the sources ask for them."""

    def __init__(
        self, sources: Sequence[_Source], reader: BundleReader, prefix: str,
        progress: Callable[[ProgressEvent], None] | None,
    ) -> None:
        whole: list[str] = []
        sliced: list[tuple[str, str]] = []
        for source in sources:
            if isinstance(source, RestoreBatch):
                for column in source.keys:
                    whole.extend(column)
                continue
            for name, key in source.keys.items():
                specs = _slice_specs(source, name)
                if specs is None:
                    whole.append(key)
                else:
                    sliced.extend((key, spec) for spec in specs)
        # Every key is looked up before anything changes, but only once a read failed (an absent
        # key fails every read, so the error is the same, and a restore that succeeds asks no key
        # twice) — or first, for a progress callback, which asks every value's size first.
        if progress is not None:
            _first_missing(sources, reader, prefix)
        try:
            self._read(reader, whole, sliced, progress)
        except Exception:
            _first_missing(sources, reader, prefix)
            raise

    def _read(
        self, reader: BundleReader, whole: list[str], sliced: list[tuple[str, str]],
        progress: Callable[[ProgressEvent], None] | None,
    ) -> None:
        reporter = None
        if progress is not None:
            total = sum(_nbytes(reader, key, None) for key in whole)
            total += sum(_nbytes(reader, key, spec) for key, spec in sliced)
            reporter = ReadProgress(progress, reader, total)
        if reporter is None:
            self._whole: Iterator[np.ndarray] = iter(reader.read_many(whole, copy=False))
        else:
            arrays = []
            for key in whole:
                array = reader.read(key, copy=False)
                reporter.advance(array.nbytes)
                arrays.append(array)
            self._whole = iter(arrays)
        slices = []
        for key, spec in sliced:
            array = _read_slice(reader, key, spec)
            if reporter is not None:
                reporter.advance(array.nbytes)
            slices.append(array)
        self._slices = iter(slices)

    def of_batch(self, batch: RestoreBatch) -> ValueColumns:
        """The values of ``batch``'s objects, a column per name (sources in reading order)."""
        count, whole = len(batch.objects), self._whole
        return ValueColumns({name: list(itertools.islice(whole, count)) for name in batch.names})

    def of(self, item: RestoreItem) -> dict[str, Any]:
        """``{own name: array or {slice spec: array}}`` of ``item`` (sources in reading order)."""
        if item.layouts is None:
            whole = self._whole
            return {name: next(whole) for name in item.keys}
        values: dict[str, Any] = {}
        for name in item.keys:
            specs = _slice_specs(item, name)
            if specs is None:
                values[name] = next(self._whole)
            else:
                values[name] = {spec: next(self._slices) for spec in specs}
        return values


class _Group:
    """The objects of one class in a restore, handed to the class's ``_prepare_restores``."""

    __slots__ = ("objects", "owned", "sources", "starts", "values")

    def __init__(self) -> None:
        self.objects: Sequence[Any] = ()
        self.values: Sequence[Mapping[str, Any]] = ()  # a batch's columns while it is alone
        self.owned = False  # whether objects and values are this group's own lists
        self.starts: list[int] = []  # index in objects of the first object of sources[k]
        self.sources: list[_Source] = []

    def add(
        self, source: _Source, objects: Sequence[Any], values: Sequence[Mapping[str, Any]]
    ) -> None:
        self.starts.append(len(self.objects))
        self.sources.append(source)
        if len(self.sources) == 1:
            self.objects, self.values = objects, values  # the usual case: one batch, as is
            return
        if not self.owned:  # the first source's lists belong to the plan: copy them once
            self.objects, self.owned = list(self.objects), True
            if not isinstance(self.values, ValueColumns):
                self.values = list(self.values)
        self.objects.extend(objects)  # type: ignore[attr-defined]  # owned: a list
        current = self.values
        if isinstance(current, ValueColumns):
            # Columns stay columns (a Checkpoint's new save_counter joins 100,000 variables).
            if isinstance(values, ValueColumns) and values.names == current.names:
                current.extend(values)
                return
            if all(_fits_columns(row, current.names) for row in values):
                for row in values:
                    current.append(row)
                return
            self.values = current = list(current)
        current.extend(values)  # type: ignore[attr-defined]  # a list

    def error(self, index: int, exc: InvalidArgumentError, *, prefix: str) -> BaseException:
        """``exc`` (object ``index``'s value does not fit it) naming the object and its keys."""
        at = bisect.bisect_right(self.starts, index) - 1
        label, _, keys = _describe(self.sources[at], index - self.starts[at])
        keys.sort()
        return InvalidArgumentError(
            f"{exc.message} (object {label}, checkpoint key {', '.join(keys)} in "
            f"{prefix}). Nothing was restored.",
            path=prefix,
            key=keys[0] if keys else None,
        )


def _fits_columns(values: Mapping[str, Any], names: tuple[str, ...]) -> bool:
    """Whether ``values`` are whole values (no slices) named exactly ``names``."""
    return tuple(values) == names and not any(isinstance(v, Mapping) for v in values.values())


def _prepare_all(sources: Sequence[_Source], values: _Values, prefix: str) -> list[_Step]:
    """Every object's checks, run by class (``batch_hook(cls, "_prepare_restores")``); the
    step of each class, the classes in the order the walk first met one of their objects."""
    groups: dict[type, _Group] = {}
    for source in sources:
        if isinstance(source, RestoreBatch):
            if not source.objects:
                continue
            cls: type = type(source.objects[0])  # a batch holds objects of one class
            objects: Sequence[Any] = source.objects
            restored: Sequence[Mapping[str, Any]] = values.of_batch(source)
        else:
            cls = type(source.trackable)
            objects, restored = (source.trackable,), (values.of(source),)
        group = groups.get(cls)
        if group is None:
            group = groups[cls] = _Group()
        group.add(source, objects, restored)
    steps: list[_Step] = []
    for cls, group in groups.items():
        if Trackable in cls.__mro__:  # (issubclass narrows cls to a type mypy cannot hash)
            prepare_restores = batch_hook(cls, "_prepare_restores")
        else:  # a duck-typed holder of MultiDeviceSaver
            prepare_restores = _prepare_holders
        on_error = functools.partial(group.error, prefix=prefix)
        steps.append(prepare_restores(group.objects, group.values, on_error))
    return steps


def _prepare_holders(
    holders: Sequence[Any],
    restored: Sequence[Mapping[str, Any]],
    on_error: Callable[[int, InvalidArgumentError], BaseException],
) -> _Step:
    """``_prepare_restores`` for objects that are not trackables: restored as they ask
    (``_prepare_restore`` if they have one, else ``_restore_from_tensors`` when applied)."""
    steps: list[_Step] = []
    for index, (holder, values) in enumerate(zip(holders, restored)):
        prepare = getattr(holder, "_prepare_restore", None)
        try:
            if prepare is None:
                steps.append(functools.partial(holder._restore_from_tensors, values))
            else:
                steps.append(prepare(values))
        except InvalidArgumentError as exc:
            raise on_error(index, exc) from exc

    def apply() -> None:
        for step in steps:
            step()

    return apply


def _registered_restores(
    registered: Mapping[str, Mapping[str, Trackable]], prefix: str
) -> list[_Step]:
    """Each registered saver's ``restore_fn`` call, its saver found and its objects checked.

    Done before any object changes: a strict predicate that rejects an object fails the
    restore while nothing has changed yet.
    """
    calls: list[_Step] = []
    for name, objects in registered.items():
        try:
            saver = get_registered_saver(name)
        except NotFoundError:
            # TF skips an unknown saver on restore (its strictness cannot be known).
            logger.warning(
                "Checkpoint %s was written with registered saver %r, which is not registered "
                "now; its objects are not restored", prefix, name,
            )
            continue
        selected = objects_to_restore(name, dict(objects))
        if selected:
            calls.append(functools.partial(saver.restore_fn, selected, prefix))
    return calls


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold a SIGINT (Ctrl-C) that arrives inside the block until the block is done.

    The apply step copies values that are already verified: an interrupt between two copies
    would leave half the objects restored. Only the main thread receives signals; elsewhere
    (and where SIGINT is not Python's to handle) this does nothing. Two handler swaps per
    restore, whatever its size.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover  (no signal support here)
        previous = None
    if not callable(previous):  # SIG_IGN, SIG_DFL or not installed by Python: leave it
        yield
        return
    held: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])  # the user's handler (KeyboardInterrupt by default), now


def restore_items(
    items: Sequence[RestoreItem],
    reader: BundleReader,
    *,
    prefix: str | None = None,
    registered: Mapping[str, Mapping[str, Trackable]] | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
    batches: Sequence[RestoreBatch] = (),
) -> None:
    """Read and verify every value of ``items`` and ``batches``, then apply them all (see the
    module docstring).

    Objects are checked and applied by class, through ``batch_hook(cls, "_prepare_restores")``
    (the per-object default maps ``_prepare_restore``): an item and a batch of one class are
    one call. Within a class, objects are applied in walk order; the classes in the order the
    walk first met an object of theirs.

    Args:
        items: the objects to restore and the keys of their values.
        reader: an open reader of the checkpoint; it must stay open during the call (values are
            views of its mapped files until they are applied).
        prefix: the checkpoint's name in messages (default: the reader's prefix).
        registered: objects of registered savers, ``{saver name: {object name: trackable}}``.
        progress: a callback receiving ``"read"`` events as values are read.
        batches: alike objects each restored whole, planned as columns of keys.

    Raises:
        NotFoundError: a key is missing (nothing changed).
        DataLossError: a value is damaged (nothing changed).
        InvalidArgumentError: a value does not fit its object, or a registered saver's strict
            predicate rejects an object (nothing changed).
        Exception: whatever a ``"read"`` progress callback raised (nothing changed), or a
            registered saver's ``restore_fn`` (built-in objects are restored by then).
    """
    name = prefix if prefix is not None else reader.prefix
    agreement = _agreement.get()
    sources = _in_walk_order(items, batches)
    try:
        values = _Values(sources, reader, name, progress)
        applies = _prepare_all(sources, values, name)
        restore_fns = _registered_restores(registered, name) if registered else ()
    except BaseException as exc:
        if agreement is not None:
            agreement.vote(exc)
        raise
    if agreement is not None:
        agreement.vote(None)
    with _interrupts_held():
        for apply in applies:
            apply()
    for restore_fn in restore_fns:
        restore_fn()
