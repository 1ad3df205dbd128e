"""How a tracked container relates to the user's list or dict it was made from.

Tracking wraps a plain list or dict (``wrap_or_unwrap`` in ``containers.py``) in a wrapper
that *views* it: changes made through the wrapper are mirrored into the user's container, and
changes made to the user's container are taken in at the next save or restore
(``_adopt_external_changes``). A wrapper made for a nested container is kept in its tracked
parent's own storage only, never written into the user's containers, which therefore keep
their structure: a JAX pytree stays one (to JAX, a ``DictWrapper`` in a plain dict is a leaf,
and ``tree_map`` or optax would fail on the user's own tree).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["Viewing", "made_from", "same_items", "source_of"]

_W = TypeVar("_W", bound="Viewing")


class Viewing:
    """Mixin of the tracked containers: the user's container a wrapper was made from."""

    # Set by made_from on the wrappers that tracking makes; None for the others.
    _self_source: Any = None


def made_from(wrapper: _W, value: Any) -> _W:
    """``wrapper``, recorded as the view of the user's container ``value``."""
    object.__setattr__(wrapper, "_self_source", value)
    return wrapper


def source_of(stored: Any) -> Any:
    """What the user's container holds for the tracked entry ``stored``: the list or dict that
    tracking wrapped, else ``stored`` itself (a wrapper the user assigned stays itself)."""
    if isinstance(stored, Viewing) and stored._self_source is not None:
        return stored._self_source
    return stored


def same_items(a: Iterable[Any], b: Iterable[Any]) -> bool:
    """Element-wise identity: arrays compare element-wise under ``==``, so compare by ``is``."""
    a_list, b_list = list(a), list(b)
    return len(a_list) == len(b_list) and all(x is y for x, y in zip(a_list, b_list))
