"""Adapter registry: how objects that are not Trackables become nodes of the object graph.

Frameworks register a factory per type (``register_adapter(np.ndarray, Variable.wrap)``;
``trackpoint/integrations/torch.py`` registers ``torch.Tensor``, ``nn.Module``, …), so the core
never imports them. Tracked containers, ``AutoTrackable`` attributes and ``Checkpoint(**kwargs)``
all convert values through :func:`to_trackable`.

One object gets one adapter while the adapter is alive, so the same array reached under two
names (an alias) is one node of the object graph, as a shared variable is in TensorFlow.

Integrations are loaded lazily: the first time a value whose class (or a base class) comes from
``torch``, ``numpy.random`` or ``jax`` is seen, the matching ``trackpoint.integrations`` module
is imported and registers its adapters (:func:`register_lazy_integration` adds more). So
``import trackpoint`` imports no framework, and a framework object needs no extra import.

Some values are recognised by content, not type: a JAX pytree is a plain dict/list/tuple of jax
arrays, which must be viewed rather than wrapped in a tracked container (the wrappers would put
themselves into the user's containers, and JAX cannot flatten them). A *structure adapter*
(:func:`register_structure_adapter`) claims such values; the JAX one is loaded as soon as jax
itself has been imported by the program.
"""

from __future__ import annotations

import importlib
import logging
import operator
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import Trackable

__all__ = [
    "AdapterFactory",
    "BatchAdapterFactory",
    "claims_structure",
    "is_adaptable",
    "register_adapter",
    "register_lazy_integration",
    "register_structure_adapter",
    "to_trackable",
    "to_trackables",
]

logger = logging.getLogger(__name__)

AdapterFactory = Callable[[Any], "Trackable"]
"""Turns one framework object into a Trackable that saves and restores it (in place)."""

BatchAdapterFactory = Callable[[list[Any]], Sequence["Trackable"]]
"""Turns a list of objects of one type into their adapters, as the factory would one by one."""

# Explicit registries (STYLE.md §1): factories by type, and a weak reference to the live
# adapter of each adapted object, keyed by id(). An adapter holds its object, so while the
# adapter lives the id cannot be reused. The references have no callbacks (a container of
# 100,000 arrays makes and drops 100,000 of them; a WeakValueDictionary's keyed references
# and removal callbacks cost Python calls each): a dead one is simply not an adapter, and dead
# entries are swept once the table has doubled since the last sweep.
_factories: dict[type, AdapterFactory] = {}
_batch_factories: dict[type, BatchAdapterFactory] = {}  # for exactly that type
_adapters: dict[int, weakref.ref[Any]] = {}
_sweep_at = 1024  # size of _adapters at which dead entries are swept next
_lock = threading.Lock()
# Module-name prefix of a framework -> the integration module registering its adapters. Filled
# by register_lazy_integration() (trackpoint.integrations registers the built-in ones), so this
# layer never names a module above it.
_lazy_integrations: dict[str, str] = {}
_loaded_integrations: set[str] = set()
# Structure adapters: (claims, factory), asked in order when no type adapter exists. An
# integration listed here is imported once its framework module is in sys.modules (it is never
# imported by us), so e.g. a dict of jax arrays is claimed before anything wraps it.
_structure_adapters: list[tuple[Callable[[Any], bool], AdapterFactory]] = []
_lazy_structure_integrations: dict[str, str] = {}


def register_adapter(
    type_: type, factory: AdapterFactory, *, many: BatchAdapterFactory | None = None
) -> None:
    """Make instances of ``type_`` (and its subclasses) trackable through ``factory``.

    ``factory(obj)`` returns a Trackable whose ``_serialize_to_tensors`` views ``obj``'s
    values and whose ``_prepare_restore`` checks restored values and returns the step that
    writes them into ``obj`` in place. Registering a
    type again replaces its factory.

    Args:
        type_: the class.
        factory: makes the adapter of one object.
        many: optionally, makes the adapters of a list of objects of exactly ``type_`` at
            once, each as ``factory`` would and with ``_self_adapted_value`` set to its object
            (a container of 100,000 numpy arrays adapts them in one call).

    Raises:
        InvalidArgumentError: ``type_`` is not a class or a factory is not callable.
    """
    if not isinstance(type_, type):
        raise InvalidArgumentError(f"register_adapter() needs a class, got {type_!r}")
    if not callable(factory) or (many is not None and not callable(many)):
        raise InvalidArgumentError(f"adapter factory for {type_.__name__} is not callable")
    _factories[type_] = factory
    if many is None:
        _batch_factories.pop(type_, None)
    else:
        _batch_factories[type_] = many


def register_lazy_integration(
    module_prefix: str, integration_module: str, *, structures: bool = False
) -> None:
    """Import ``integration_module`` when a value of a class from ``module_prefix`` is seen.

    ``register_lazy_integration("mylib", "mylib_trackpoint")`` imports ``mylib_trackpoint``
    (which calls :func:`register_adapter`) the first time a ``mylib.*`` object is tracked.
    With ``structures=True`` the integration is also imported as soon as ``module_prefix`` is
    in ``sys.modules`` and a plain container is tracked, so it can claim containers of its
    values (JAX pytrees) before they are wrapped.

    Raises:
        InvalidArgumentError: an empty prefix or a non-str module name.
    """
    if not module_prefix or not isinstance(module_prefix, str):
        raise InvalidArgumentError(
            f"register_lazy_integration() needs a module prefix, got {module_prefix!r}"
        )
    if not isinstance(integration_module, str) or not integration_module:
        raise InvalidArgumentError(
            f"register_lazy_integration() needs a module name, got {integration_module!r}"
        )
    _lazy_integrations[module_prefix] = integration_module
    if structures:
        _lazy_structure_integrations[module_prefix] = integration_module


def _integration_for(klass: type) -> str | None:
    module = getattr(klass, "__module__", None) or ""
    for prefix, integration in _lazy_integrations.items():
        if module == prefix or module.startswith(prefix + "."):
            return integration
    return None


def _activate_integration(cls: type) -> bool:
    """Import the integration owning one of ``cls``'s bases, once; True if one was imported.

    A missing integration module (e.g. no JAX support installed) is skipped; an error raised
    while importing one that exists propagates, so a broken integration is not silently ignored.
    """
    for klass in cls.__mro__:
        integration = _integration_for(klass)
        if integration is None or integration in _loaded_integrations:
            continue
        try:
            importlib.import_module(integration)  # thread-safe: waits for a concurrent import
        except ModuleNotFoundError as exc:
            if exc.name != integration:
                raise
            logger.debug("no trackpoint integration %s for %s", integration, klass)
            _loaded_integrations.add(integration)
            continue
        _loaded_integrations.add(integration)
        return True
    return False


def register_structure_adapter(claims: Callable[[Any], bool], factory: AdapterFactory) -> None:
    """Make values that ``claims(value)`` accepts trackable through ``factory``.

    For values recognised by content rather than type, such as JAX pytrees (plain containers
    of jax arrays). Asked only for values without a type adapter; a claimed list, dict or tuple
    is tracked through ``factory`` instead of being wrapped in a tracked container.

    Raises:
        InvalidArgumentError: ``claims`` or ``factory`` is not callable.
    """
    if not callable(claims) or not callable(factory):
        raise InvalidArgumentError("register_structure_adapter() needs two callables")
    _structure_adapters.append((claims, factory))


def _structure_factory(value: Any) -> AdapterFactory | None:
    for framework, integration in _lazy_structure_integrations.items():
        if framework in sys.modules and integration not in _loaded_integrations:
            try:
                importlib.import_module(integration)
            except ModuleNotFoundError as exc:
                if exc.name != integration:
                    raise
            _loaded_integrations.add(integration)
    for claims, factory in _structure_adapters:
        if claims(value):
            return factory
    return None


def claims_structure(value: Any) -> bool:
    """True if a structure adapter tracks ``value`` (so it must not be wrapped in place)."""
    return _lookup(value) is None and _structure_factory(value) is not None


def _lookup(value: Any) -> AdapterFactory | None:
    return _lookup_type(type(value))


def _lookup_type(kind: type) -> AdapterFactory | None:
    for klass in kind.__mro__:
        factory = _factories.get(klass)
        if factory is not None:
            return factory
    return None


def _factory_for(value: Any) -> AdapterFactory | None:
    factory = _lookup(value)
    if factory is None and _activate_integration(type(value)):
        factory = _lookup(value)
    if factory is None and (_structure_adapters or _lazy_structure_integrations):
        factory = _structure_factory(value)
    return factory


def is_adaptable(value: Any) -> bool:
    """True if a registered adapter can turn ``value`` into a Trackable."""
    return _factory_for(value) is not None


def to_trackable(value: Any) -> Trackable | None:
    """``value`` itself if it is a Trackable, its (cached) adapter if one is registered, or None."""
    if isinstance(value, Trackable):
        return value
    adapter = _live_adapter(value)  # the usual case: adapted before (no lock to read)
    if adapter is not None:
        return adapter
    factory = _factory_for(value)
    if factory is None:
        return None
    with _lock:
        adapter = _live_adapter(value)
        if adapter is not None:
            return adapter
        adapter = _checked(factory(value), value)
        _register([adapter])
        return adapter


def to_trackables(values: list[Any]) -> list[Trackable | None]:
    """:func:`to_trackable` of each of ``values``, in order.

    For the large container (100,000 numpy arrays) the lookups and the registration run in
    one pass per list, not one call chain per value; values of mixed types go one by one.
    """
    kinds = set(map(type, values))
    if len(kinds) != 1:
        return list(map(to_trackable, values))
    (kind,) = kinds
    if issubclass(kind, Trackable):
        return list(values)
    factory = _lookup_type(kind)
    if factory is None:
        return list(map(to_trackable, values))  # integrations, structures: the general path
    with _lock:
        refs = list(map(_adapters.get, map(id, values)))
        found: list[Any] = [None if ref is None else ref() for ref in refs]
        if refs.count(None) != len(refs):  # some were adapted before: keep those adapters
            found = [
                adapter if adapter is not None and adapter._self_adapted_value is value
                else None
                for adapter, value in zip(found, values)
            ]
        missing = [value for adapter, value in zip(found, values) if adapter is None]
        # One adapter per object, also for an object listed twice (an alias).
        distinct = list({id(value): value for value in missing}.values())
        many = _batch_factories.get(kind)
        if many is not None and _factories.get(kind) is factory:
            made = list(many(distinct))  # each a Trackable holding its _self_adapted_value
        else:
            made = [_checked(factory(value), value) for value in distinct]
        if made:
            _register(made)
            if len(distinct) != len(missing):
                adapter_of = dict(zip(map(id, distinct), made))
                made = list(map(adapter_of.__getitem__, map(id, missing)))
            fresh = iter(made)
            found = [next(fresh) if adapter is None else adapter for adapter in found]
        return found


def _live_adapter(value: Any) -> Trackable | None:
    """The registered adapter of ``value`` if it is alive, else None."""
    ref = _adapters.get(id(value))
    if ref is None:
        return None
    adapter = ref()
    if adapter is not None and adapter._self_adapted_value is value:
        return adapter  # type: ignore[no-any-return]
    return None


def _checked(adapter: Any, value: Any) -> Trackable:
    """``adapter``, made by a factory for ``value``, once it is known to be a Trackable."""
    if not isinstance(adapter, Trackable):
        raise InvalidArgumentError(
            f"the adapter for {type(value).__name__} returned {type(adapter).__name__}, "
            "which is not a Trackable"
        )
    object.__setattr__(adapter, "_self_adapted_value", value)
    return adapter


def _register(adapters: list[Trackable]) -> None:
    """Record each adapter under its object's id (with ``_lock`` held)."""
    global _sweep_at
    _adapters.update(
        zip(
            map(id, map(_ADAPTED_VALUE, adapters)),
            map(weakref.ref, adapters),
        )
    )
    if len(_adapters) >= _sweep_at:
        for key in [key for key, ref in _adapters.items() if ref() is None]:
            del _adapters[key]
        _sweep_at = max(1024, 2 * len(_adapters))


_ADAPTED_VALUE = operator.attrgetter("_self_adapted_value")
