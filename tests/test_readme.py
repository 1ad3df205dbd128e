"""The README's Python examples run as written (paths moved under a temporary directory)."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _runnable(block: str) -> bool:
    return "/path/to/" not in block


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if _runnable(b)], ids=lambda b: b.splitlines()[1][:40]
)
def test_readme_example_runs(block, tmp_path):
    for module in ("torch", "jax", "optax", "lightning", "keras"):
        if f"import {module}" in block:
            pytest.importorskip(module)
    code = block.replace('"/tmp/', f'"{tmp_path}/')
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})


def test_readme_has_the_numpy_torch_and_jax_examples():
    assert len([b for b in BLOCKS if _runnable(b)]) >= 3
