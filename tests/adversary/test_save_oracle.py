"""The differential save oracle, property-based: every save path x every framework.

Hypothesis draws a state (nested dicts/lists of arrays of every dtype, 0-d, empty, strided,
Fortran-ordered and big-endian; plain values; torch modules with optimizers; JAX trees with an
optax state; ``PythonState``s), a sequence of edits between saves (in place, rebinding,
adding/removing children, optimizer steps) and a save path. At each save the oracle copies the
values reachable at the call (oracle.py, through the frameworks' own APIs), and after the save
completes it reads the checkpoint back by key and restores fresh objects from it: both must
equal the copy bit for bit. Async saves are scrambled right after ``save()`` returns.

Bounded for ``make test`` (a few derandomized examples per path and framework);
``TRACKPOINT_ORACLE_EXAMPLES=2000`` runs long, with random examples.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from oracle import SAVE_COUNTER_KEY, Expected, assert_same, capture, check_checkpoint
from oracle_scenarios import (
    DTYPES,
    OPTIMIZERS,
    TORCH_CHILDREN,
    JaxScenario,
    JsonState,
    NumpyScenario,
    PlainScenario,
    TorchScenario,
    make_array,
)

import trackpoint as tp

_LONG = os.environ.get("TRACKPOINT_ORACLE_EXAMPLES")
EXAMPLES = int(_LONG) if _LONG else 2
ORACLE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=_LONG is None,
    database=None,
    phases=list(Phase) if _LONG else [Phase.explicit, Phase.generate],  # shrink: long runs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PATHS = [
    "write",
    "save",
    "async",
    "staging",
    "incremental",
    "incremental_async",
    "max_shard",
    "manager",
]

# -- strategies ----------------------------------------------------------------------------------

names = st.text(alphabet="ab./_", min_size=1, max_size=3)
arrays = st.builds(
    make_array,
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**30),
    st.sampled_from(["c", "fortran", "strided"]),
)
plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.floats(width=32).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.booleans().map(np.bool_),
)
plain_values = st.recursive(
    plain_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
    ),
    max_leaves=6,
)


def _trees(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    nested = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.dictionaries(names, inner, max_size=3), st.lists(inner, max_size=3)
        ),
        max_leaves=8,
    )
    return st.dictionaries(names, nested, min_size=1, max_size=4)


numpy_roots = st.fixed_dictionaries(
    {
        "tree": _trees(st.one_of(arrays, arrays, plain_values)),
        "extra": st.lists(st.one_of(arrays, plain_values), max_size=3),
    }
)
plain_roots = st.fixed_dictionaries(
    {
        "state": st.dictionaries(st.text(max_size=4), plain_values, min_size=1, max_size=4),
        "hist": st.lists(plain_values, min_size=1, max_size=4),
        "counter": st.dictionaries(st.sampled_from("xyz"), st.integers(), max_size=2).map(
            JsonState
        ),
    }
)
torch_children = st.lists(
    st.tuples(st.sampled_from("abcdef"), st.sampled_from(TORCH_CHILDREN), st.integers(0, 999)),
    min_size=1,
    max_size=4,
    unique_by=lambda c: c[0],
)


def _jax_trees() -> st.SearchStrategy[dict[str, Any]]:
    import jax.numpy as jnp
    from oracle_scenarios import JAX_DTYPES

    leaf = st.builds(
        lambda d, s, seed: jnp.asarray(make_array(d, s, seed, "c")),
        st.sampled_from(JAX_DTYPES),
        st.lists(st.integers(0, 3), max_size=2).map(tuple),
        st.integers(0, 2**30),
    )
    nested = st.dictionaries(names, leaf, min_size=1, max_size=2)  # empty: a known finding
    return st.dictionaries(names, st.one_of(leaf, nested), min_size=1, max_size=4)


jax_trees = st.deferred(_jax_trees)  # jax is imported when the first example is drawn


def intervals(actions: tuple[str, ...]) -> st.SearchStrategy[list[list[tuple[str, int]]]]:
    """Edits before each save: the first save sees the initial state."""
    step = st.tuples(st.sampled_from(actions), st.integers(0, 2**30))
    return st.lists(st.lists(step, max_size=3), min_size=2, max_size=4).map(
        lambda saves: [[], *saves[1:]]
    )


# -- the driver ---------------------------------------------------------------------------------


def _options(path: str, data: st.DataObject) -> tp.CheckpointOptions | None:
    if path == "async":
        return tp.CheckpointOptions(enable_async=True)
    if path == "staging":
        staging = data.draw(st.integers(1, 4096), label="max_staging_bytes")
        return tp.CheckpointOptions(enable_async=True, max_staging_bytes=staging)
    if path == "incremental":
        return tp.CheckpointOptions(incremental=True)
    if path == "incremental_async":
        return tp.CheckpointOptions(incremental=True, enable_async=True)
    if path == "max_shard":
        size = data.draw(st.integers(1, 512), label="max_shard_size_bytes")
        return tp.CheckpointOptions(sharding_policy=tp.sharding.MaxShardSizePolicy(size))
    if path == "manager":
        inner = data.draw(
            st.sampled_from(
                ["save", "async", "incremental", "incremental_async", "max_shard", "staging"]
            ),
            label="manager options",
        )
        return _options(inner, data)
    return None


def _without_counter(expected: Expected) -> Expected:
    tensors = {k: v for k, v in expected.tensors.items() if k != SAVE_COUNTER_KEY}
    return Expected(tensors, expected.plain, expected.raw_strings, expected.loose_py_state)


def run_oracle(
    scenario: Any,
    path: str,
    steps: list[list[tuple[str, int]]],
    data: st.DataObject,
    tf: Any = None,
) -> None:
    """Save after each interval of edits by ``path``; check every save against the oracle."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = tp.Checkpoint(**scenario.roots)
        manager = tp.CheckpointManager(ckpt, tmp, max_to_keep=2) if path == "manager" else None
        kept: dict[str, Expected] = {}
        saves = 0
        try:
            for number, interval in enumerate(steps):
                for action, seed in interval:
                    scenario.act(action, seed, ckpt)
                options = _options(path, data)
                counter = None if path == "write" else saves + 1
                expected = capture(scenario.roots, save_counter=counter)
                restore = scenario.restorer()
                if manager is not None:
                    prefix = manager.save(options=options)
                elif path == "write":
                    prefix = ckpt.write(os.path.join(tmp, f"w{number}"), options)
                else:
                    prefix = ckpt.save(os.path.join(tmp, "ckpt"), options)
                saves += 1
                if options is not None and options.enable_async:
                    scenario.scramble(number + 17, ckpt)  # values at the call must be saved
                    (manager or ckpt).sync()
                where = f"save {number + 1} by {path!r} ({options})"
                check_checkpoint(
                    prefix, expected, tf=tf if number == len(steps) - 1 else None, where=where
                )
                assert_same(
                    _without_counter(expected),
                    restore(prefix),
                    f"{where}: fresh objects restored from {prefix}",
                )
                kept[prefix] = expected
            if manager is not None:  # every checkpoint still kept still holds its own values
                for prefix in manager.checkpoints:
                    check_checkpoint(prefix, kept[prefix], where="after rotation")
        finally:
            ckpt.sync()


@pytest.mark.parametrize("path", PATHS)
@ORACLE
@given(roots=numpy_roots, steps=intervals(NumpyScenario({}).ACTIONS), data=st.data())
def test_numpy_trees_save_what_is_reachable_at_the_call(path, roots, steps, data, tf) -> None:
    run_oracle(NumpyScenario(roots), path, steps, data, tf)


@pytest.mark.parametrize("path", PATHS)
@ORACLE
@given(roots=plain_roots, steps=intervals(PlainScenario({}).ACTIONS), data=st.data())
def test_plain_values_and_python_state_save_what_is_reachable(path, roots, steps, data, tf) -> None:
    run_oracle(PlainScenario(roots), path, steps, data, tf)


@pytest.mark.parametrize("path", PATHS)
@ORACLE
@given(
    children=torch_children,
    optimizer=st.sampled_from(OPTIMIZERS),
    steps=intervals(TorchScenario.ACTIONS),
    data=st.data(),
)
def test_torch_module_and_optimizer_save_their_state_dicts(
    path, children, optimizer, steps, data, tf
) -> None:
    pytest.importorskip("torch")
    scenario = TorchScenario(children, optimizer)
    scenario.step(1)
    run_oracle(scenario, path, steps, data, tf)


@pytest.mark.parametrize("path", PATHS)
@ORACLE
@given(
    params=jax_trees,
    with_optax=st.booleans(),
    steps=intervals(JaxScenario.ACTIONS),
    data=st.data(),
)
def test_jax_trees_save_their_leaves(path, params, with_optax, steps, data, tf) -> None:
    run_oracle(JaxScenario(params, with_optax), path, steps, data, tf)
