"""Fixtures for bundle tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def prefix(tmp_path) -> str:  # noqa: ANN001
    return str(tmp_path / "ckpt")
