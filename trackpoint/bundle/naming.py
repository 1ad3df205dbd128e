"""Where a bundle's files live: their names (tf-checkpoint-format.md §1) and storage."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trackpoint.storage.base import Storage

__all__ = ["data_filename", "index_filename", "resolve_storage"]


def index_filename(prefix: str) -> str:
    """``prefix.index``: the sorted table whose presence means the checkpoint exists."""
    return f"{prefix}.index"


def data_filename(prefix: str, shard_id: int, num_shards: int) -> str:
    """``prefix.data-SSSSS-of-NNNNN`` (printf ``%05d``, wider when the number needs it)."""
    return f"{prefix}.data-{shard_id:05d}-of-{num_shards:05d}"


def resolve_storage(prefix: str, storage: Storage | None) -> Storage:
    """``storage`` if given, else the backend ``trackpoint.storage`` picks for ``prefix``."""
    if storage is not None:
        return storage
    from trackpoint.storage import locate

    return locate(prefix).storage
