"""The value phase of every restore: read and verify every value, then change the objects.

Every restore ends here — ``Checkpoint.read``/``restore`` (through the planner in
:mod:`trackpoint.checkpoint.restore`), deferred restores when an object is attached, name-based
restores, ``tp.jax.restore``, the distributed layer and :meth:`MultiDeviceSaver.restore` —
so one set of rules holds for all of them:

1. every key the items need is looked up (a missing key fails, naming its object, before any
   object changes — and whatever else failed; for a :class:`VariableBatch` of 100,000 keys
   the lookup runs only once a read has failed, since an absent key fails every read);
2. every value is read and its crc32c verified (:meth:`BundleReader.read_many`, slices with
   :meth:`BundleReader.read_slice`); arrays are zero-copy views of the mapped files, so
   verifying first holds no second copy of the state;
3. every object checks its values (``Trackable._prepare_restore``: shape, dtype, slot shapes,
   optimizer group sizes, whether the target can be written at all: a read-only array, a torch
   tensor whose elements share memory) and returns the step that applies them; registered
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

import contextlib
import contextvars
import functools
import itertools
import logging
import math
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
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.variable import Variable, prepare_variable_restores

__all__ = [
    "RestoreAgreement",
    "RestoreItem",
    "VariableBatch",
    "agreement_pending",
    "restore_agreement",
    "restore_items",
]

logger = logging.getLogger(__name__)

Label = str | Callable[[], str]


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


class VariableBatch(NamedTuple):
    """Plain variables each restored whole from one checkpoint key, among a list of items.

    Most values of a large model: kept as parallel lists instead of one :class:`RestoreItem`
    each, and checked in one loop (``prepare_variable_restores``), so a restore of 100,000 of
    them builds no object per value. Values are read, checked and applied in walk order: the
    variables before ``items[j]`` are ``variables[:positions[j]]``.
    """

    variables: Sequence[Variable]
    """Variables of exactly ``tp.Variable``'s class (a subclass may check more)."""
    keys: Sequence[str]
    """The checkpoint key of each variable's value."""
    positions: Sequence[int]
    """``positions[j]``: how many variables come before ``items[j]`` in walk order."""
    label: Callable[[int], str]
    """Readable path of ``variables[i]``, for messages (called only on error)."""


def _segments(
    items: Sequence[RestoreItem], batch: VariableBatch
) -> Iterator[tuple[int, int, RestoreItem | None]]:
    """``(start, stop, item)``: the variables ``[start:stop]``, then ``item``, in walk order."""
    start = 0
    for item, position in zip(items, batch.positions):
        yield start, position, item
        start = position
    yield start, len(batch.variables), None


def _as_items(items: Sequence[RestoreItem], batch: VariableBatch) -> list[RestoreItem]:
    """Every variable of ``batch`` as a :class:`RestoreItem`, among ``items`` in walk order."""
    merged: list[RestoreItem] = []
    for start, stop, item in _segments(items, batch):
        merged.extend(_variable_item(batch, i) for i in range(start, stop))
        if item is not None:
            merged.append(item)
    return merged


def _raise_missing(
    items: Sequence[RestoreItem], batch: VariableBatch, reader: BundleReader, prefix: str
) -> None:
    """Raise NotFoundError for the first key, in walk order, the checkpoint lacks (if any)."""
    has_tensor = reader.has_tensor
    for start, stop, item in _segments(items, batch):
        for index in range(start, stop):
            if not has_tensor(batch.keys[index]):
                raise _missing(_variable_item(batch, index), batch.keys[index], prefix)
        for key in item.keys.values() if item is not None else ():
            if not has_tensor(key):
                assert item is not None
                raise _missing(item, key, prefix)


def _variable_item(batch: VariableBatch, index: int) -> RestoreItem:
    return RestoreItem(
        batch.variables[index], {VARIABLE_VALUE_KEY: batch.keys[index]},
        functools.partial(batch.label, index),
    )


def _label(item: RestoreItem) -> str:
    return item.label if isinstance(item.label, str) else item.label()


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


def _missing(item: RestoreItem, key: str, prefix: str) -> NotFoundError:
    return NotFoundError(
        f"Key {key} not found in checkpoint {prefix}: the object {_label(item)} "
        f"({type(item.trackable).__name__}) expects it. The checkpoint was written by a program "
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
    """Every value the items need, read and verified, in the order the items ask for them."""

    def __init__(
        self, items: Sequence[RestoreItem], reader: BundleReader, prefix: str,
        progress: Callable[[ProgressEvent], None] | None, batch: VariableBatch | None = None,
    ) -> None:
        whole: list[str] = []
        sliced: list[tuple[str, str]] = []
        # Every key is looked up before anything is read. With a batch (100,000 keys, no
        # progress) only after a read failed: an absent key fails every read, so the error is
        # the same, and a restore that succeeds asks no key twice.
        has_tensor = reader.has_tensor if batch is None else None
        segments = (
            _segments(items, batch) if batch is not None else ((0, 0, item) for item in items)
        )
        for start, stop, maybe_item in segments:
            if start != stop:
                assert batch is not None and progress is None  # restore_items sees to it
                whole.extend(batch.keys[start:stop])
            if maybe_item is None:
                continue
            item = maybe_item
            for name, key in item.keys.items():
                if has_tensor is not None and not has_tensor(key):
                    raise _missing(item, key, prefix)
                specs = _slice_specs(item, name)
                if specs is None:
                    whole.append(key)
                else:
                    sliced.extend((key, spec) for spec in specs)
        try:
            self._read(reader, whole, sliced, progress)
        except Exception:
            if batch is not None:
                _raise_missing(items, batch, reader, prefix)
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

    def take(self, count: int) -> list[np.ndarray]:
        """The next ``count`` whole values (a segment of a :class:`VariableBatch`)."""
        return list(itertools.islice(self._whole, count))

    def of(self, item: RestoreItem) -> dict[str, Any]:
        """``{own name: array or {slice spec: array}}`` of ``item`` (items in reading order)."""
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


def _prepare(item: RestoreItem, values: Mapping[str, Any], prefix: str) -> Callable[[], None]:
    trackable = item.trackable
    try:
        prepare = getattr(trackable, "_prepare_restore", None)
        if prepare is None:  # a duck-typed holder of MultiDeviceSaver: restored as it asks
            return functools.partial(trackable._restore_from_tensors, values)
        return prepare(values)  # type: ignore[no-any-return]
    except InvalidArgumentError as exc:
        raise _does_not_fit(exc, item, prefix) from exc


def _does_not_fit(exc: InvalidArgumentError, item: RestoreItem, prefix: str) -> CheckpointError:
    """``exc`` (a value does not fit ``item``'s object) naming the object and its keys."""
    keys = sorted(item.keys.values())
    return InvalidArgumentError(
        f"{exc.message} (object {_label(item)}, checkpoint key {', '.join(keys)} in "
        f"{prefix}). Nothing was restored.",
        path=prefix,
        key=keys[0] if keys else None,
    )


def _prepare_batch(
    items: Sequence[RestoreItem], batch: VariableBatch, values: _Values, prefix: str
) -> list[Callable[[], None]]:
    """The apply steps of ``batch`` and ``items``, every value checked, in walk order."""
    applies: list[Callable[[], None]] = []
    variables = batch.variables
    for start, stop, item in _segments(items, batch):
        if start != stop:

            def fail(index: int, exc: InvalidArgumentError, start: int = start) -> BaseException:
                return _does_not_fit(exc, _variable_item(batch, start + index), prefix)

            arrays = values.take(stop - start)
            applies.append(prepare_variable_restores(variables[start:stop], arrays, fail))
        if item is not None:
            applies.append(_prepare(item, values.of(item), prefix))
    return applies


_RestoreFn = Callable[[], None]


def _registered_restores(
    registered: Mapping[str, Mapping[str, Trackable]], prefix: str
) -> list[_RestoreFn]:
    """Each registered saver's ``restore_fn`` call, its saver found and its objects checked.

    Done before any object changes: a strict predicate that rejects an object fails the
    restore while nothing has changed yet.
    """
    calls: list[_RestoreFn] = []
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
    variables: VariableBatch | None = None,
) -> None:
    """Read and verify every value of ``items``, then apply them all (see the module docstring).

    Args:
        items: the objects to restore and the keys of their values.
        reader: an open reader of the checkpoint; it must stay open during the call (values are
            views of its mapped files until they are applied).
        prefix: the checkpoint's name in messages (default: the reader's prefix).
        registered: objects of registered savers, ``{saver name: {object name: trackable}}``.
        progress: a callback receiving ``"read"`` events as values are read.
        variables: plain variables restored with ``items``, in the walk order it records.

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
    if variables is not None and (progress is not None or not variables.variables):
        items, variables = _as_items(items, variables), None  # read value by value
    try:
        values = _Values(items, reader, name, progress, variables)
        if variables is None:
            applies = [_prepare(item, values.of(item), name) for item in items]
        else:
            applies = _prepare_batch(items, variables, values, name)
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
