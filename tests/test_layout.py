"""The tree is the picture of DESIGN.md's layers table (STYLE §1, §8).

Import direction and circles are checked by ``lint-imports`` (pyproject.toml's contracts, run by
``make test``); this file pins what import-linter cannot see: the folders, module sizes, imports
of the root package from inside it, and tests/ mirroring the packages.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import trackpoint

PACKAGE = pathlib.Path(trackpoint.__file__).parent
TESTS = pathlib.Path(__file__).parent

# DESIGN.md's layers table, bottom-up.
LAYERS = [
    "metrics",
    "storage",
    "bundle",
    "tracking",
    "graph",
    "saving",
    "management",
    "checkpoint",
    "integrations",
    "convert",
    "distributed",
    "cli",
    "testing",  # above every layer: suites shipped for users (StorageTests), imported by none
]
# Under every layer: the exceptions, the accepted input types, the GC pause.
BASE_MODULES = ["__init__.py", "_gc.py", "_types.py", "errors.py"]

MAX_LINES = 600  # STYLE §1: 100–400 is normal, 600 the ceiling

# Whole-package concerns: the public API, errors.py, _gc.py, this layout, the README.
TOP_LEVEL_TESTS = [
    "conftest.py",
    "test_bench_profile.py",  # bench/, outside the package
    "test_bench_run.py",
    "test_errors.py",
    "test_gc_pause.py",
    "test_layout.py",
    "test_public_api.py",
    "test_readme.py",
]


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not p.name.endswith("_pb2.py"))


def test_every_layer_is_a_package_folder() -> None:
    for layer in LAYERS:
        assert (PACKAGE / layer / "__init__.py").is_file(), layer


def test_nothing_lives_outside_the_layers() -> None:
    top_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top_modules == BASE_MODULES
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == sorted(LAYERS)


def test_no_module_over_the_size_ceiling() -> None:
    too_long = {}
    for path in _modules():
        with path.open(encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            too_long[str(path.relative_to(PACKAGE))] = lines
    assert too_long == {}, f"split these by concept (STYLE §1): {too_long}"


def _submodule_names() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }


def test_layers_never_import_the_root_package() -> None:
    # `import trackpoint` or `from trackpoint import Checkpoint` inside a layer reaches the top
    # of the tree, which import-linter's layers contract cannot see (the root is in no layer).
    # Submodules (`from trackpoint import metrics`) are fine; the cli is the top layer.
    submodules = _submodule_names()
    offenders = []
    for path in _modules():
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("__init__.py", "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                if any(alias.name == "trackpoint" for alias in node.names):
                    offenders.append(f"{relative}:{node.lineno}")
            elif (
                isinstance(node, ast.ImportFrom) and node.module == "trackpoint" and node.level == 0
            ):
                if any(alias.name not in submodules for alias in node.names):
                    offenders.append(f"{relative}:{node.lineno}")
    assert offenders == []


def test_every_integration_module_is_in_a_framework_family() -> None:
    # pyproject.toml's "integrations-*" contracts keep the frameworks apart; a module that no
    # contract lists would escape them.
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    families = [
        contract["source_modules"]
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["id"].startswith("integrations-")
    ]
    listed = [module for family in families for module in family]
    modules = sorted(
        f"trackpoint.integrations.{p.stem}"
        for p in (PACKAGE / "integrations").glob("*.py")
        if p.name != "__init__.py"
    )
    assert sorted(listed) == modules


# Suites that hold every layer to one invariant (the fuzzer, the hostile corpus, the save
# oracle: docs/design.md) belong to no package; they are the only folder that may cross them.
CROSS_CUTTING = {"adversary"}


def test_tests_mirror_the_packages() -> None:
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    strays = set(folders) - set(LAYERS) - CROSS_CUTTING
    assert not strays, f"test folders named after no package: {sorted(strays)}"
    top_level = sorted(p.name for p in TESTS.glob("*.py"))
    misplaced = sorted(set(top_level) - set(TOP_LEVEL_TESTS))
    assert misplaced == [], f"move these under tests/<package>/: {misplaced}"
