"""Shared fixtures.

``tf`` gives real TensorFlow for interoperability tests. Under ``make test`` (which sets
TRACKPOINT_REQUIRE_TENSORFLOW=1) a missing TensorFlow is an error, not a skip, so interop can
never silently stop being tested.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _require(module: str):  # noqa: ANN202
    if os.environ.get("TRACKPOINT_REQUIRE_TENSORFLOW") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def tf():  # noqa: ANN201
    """The real ``tensorflow`` module (test-only dependency)."""
    module = _require("tensorflow")
    module.get_logger().setLevel("ERROR")
    return module
