"""`SaveChecked`: objects that can only tell at save time whether they can be saved.

A tracked container learns what its entries are when it is saved (they may have been rebound
since it was made), and a jax array may have been deleted (donated to a jitted function) after
it was tracked. Neither knows where it sits in the object graph, so the graph walk
(``trackpoint.graph.serialize.serialize_graph``) calls :meth:`SaveChecked._check_saveable` with the
object's readable path before it asks for the object's values; the error then names the value
as the user reaches it, e.g. ``(root).extra['handle']``.
"""

from __future__ import annotations

__all__ = ["SaveChecked"]


class SaveChecked:
    """Mixin for trackables that check, once per save, that everything they hold can be saved."""

    def _check_saveable(self, where: str) -> None:
        """Raise a ``trackpoint.errors`` error if this object cannot be saved now.

        Args:
            where: the object's readable path, ``(root).extra``; messages append to it
                (``(root).extra['handle']``) and say how to fix the value.
        """
