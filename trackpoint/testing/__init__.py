"""Test suites that ship with trackpoint, for code built on its interfaces (needs pytest).

``from trackpoint.testing import StorageTests``: the conformance tests of a storage backend
(docs/storage.md). ``import trackpoint`` does not import this package, nor pytest.
"""

from __future__ import annotations

from trackpoint.testing.storage import StorageTests

__all__ = ["StorageTests"]
