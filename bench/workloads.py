"""The benchmark's workloads: named sets of tensors, generated deterministically.

Every tensor is drawn from its own generator seeded by ``(seed, index)``, so any single tensor
can be regenerated on its own: a child process measuring peak RSS builds exactly the tensors
the parent timed, and the 4 GiB workload can be verified tensor by tensor without holding a
second copy of the state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "BF16",
    "MANY_LAYERS",
    "MANY_LAYERS_QUICK",
    "WORKLOADS",
    "TensorSpec",
    "Workload",
    "compare_tensors",
    "get_workload",
    "get_workloads",
    "many_layer_count",
    "many_workload",
    "zeros_like_specs",
]

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of a workload."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of tensor specs; ``generate`` materialises them."""

    key: str
    title: str
    specs: tuple[TensorSpec, ...]
    big: bool = False
    # "tensors": a flat {name: ndarray} every general system saves; "many": a model's layers
    # and optimizer state, saved by the systems of bench/many.py in their own structures.
    kind: str = "tensors"

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    @property
    def has_bf16(self) -> bool:
        return any(s.dtype == BF16 for s in self.specs)

    def tensor(self, index: int, seed: int) -> np.ndarray:
        """Tensor ``index``, identical on every call with the same ``seed``."""
        spec = self.specs[index]
        rng = np.random.default_rng([seed, index])
        if spec.dtype.kind == "i":
            return rng.integers(0, 1 << 30, size=spec.shape, dtype=spec.dtype)
        if spec.dtype == np.float32:
            out = np.empty(spec.shape, np.float32)
            rng.random(dtype=np.float32, out=out)
            return out
        return rng.random(spec.shape, dtype=np.float32).astype(spec.dtype)

    def generate(self, seed: int) -> dict[str, np.ndarray]:
        """All tensors, in spec order (the order every system writes them)."""
        return {s.name: self.tensor(i, seed) for i, s in enumerate(self.specs)}

    def iter_source(self, seed: int) -> Iterator[tuple[str, np.ndarray]]:
        """(name, tensor) pairs regenerated one at a time (verification of big workloads)."""
        for i, s in enumerate(self.specs):
            yield s.name, self.tensor(i, seed)


def zeros_like_specs(specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    """Zero-filled, already resident arrays: the live model an in-place restore fills."""
    out = {}
    for s in specs:
        a = np.empty(s.shape, s.dtype)
        a.fill(0)  # np.zeros would leave untouched pages unmapped until the restore
        out[s.name] = a
    return out


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's raw bits: exact comparison for any dtype, bf16 and NaN included."""
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def compare_tensors(name: str, expected: np.ndarray, got: object) -> str | None:
    """None when ``got`` equals ``expected`` bit for bit, else what differs."""
    if isinstance(got, np.generic):  # TF and torch hand back 0-d values as numpy scalars
        got = np.asarray(got)
    if not isinstance(got, np.ndarray):
        return f"{name}: restored a {type(got).__name__}, not an ndarray"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (
            f"{name}: restored {got.dtype}{list(got.shape)}, "
            f"expected {expected.dtype}{list(expected.shape)}"
        )
    if not np.array_equal(_bits(expected), _bits(got)):
        return f"{name}: values differ"
    return None


# -- the workloads ---------------------------------------------------------------------------
def _uniform(key: str, title: str, count: int, shape: tuple[int, ...], big: bool) -> Workload:
    specs = tuple(TensorSpec(f"t{i:03d}", shape, np.dtype(np.float32)) for i in range(count))
    return Workload(key, title, specs, big)


def _small(count: int) -> Workload:
    # Lengths cycle through 16..512 floats (≈1 KiB on average): per-tensor overhead dominates.
    specs = tuple(
        TensorSpec(f"s{i:06d}", (16 + (i * 37) % 497,), np.dtype(np.float32)) for i in range(count)
    )
    return Workload("small", f"{count:,} small float32 tensors", specs)


def _small_dict(count: int) -> Workload:
    # issue 19's case: float32 values of 64–191 elements in one flat dict whose keys have "/"
    # (as a state_dict flattened with "/" would): the object layer's cost per value shows.
    specs = tuple(
        TensorSpec(f"layer{i // 8:05d}/w{i % 8}", (64 + (i * 37) % 128,), np.dtype(np.float32))
        for i in range(count)
    )
    return Workload("small-dict", f"{count:,} small float32 values in a dict with '/' keys",
                    specs)


def _mixed(d: int, layers: int, vocab: int) -> Workload:
    """A transformer-shaped state: bf16 weights, fp32 Adam slots m and v, an int64 step."""
    params: list[tuple[str, tuple[int, ...]]] = [("embed", (vocab, d))]
    for layer in range(layers):
        p = f"layer{layer:02d}"
        params += [
            (f"{p}_ln1", (d,)),
            (f"{p}_attn_qkv", (d, 3 * d)),
            (f"{p}_attn_out", (d, d)),
            (f"{p}_ln2", (d,)),
            (f"{p}_mlp_in", (d, 4 * d)),
            (f"{p}_mlp_out", (4 * d, d)),
        ]
    params.append(("final_ln", (d,)))
    specs = [TensorSpec(f"model_{n}", s, BF16) for n, s in params]
    for slot in ("m", "v"):
        specs += [TensorSpec(f"opt_{slot}_{n}", s, np.dtype(np.float32)) for n, s in params]
    specs.append(TensorSpec("opt_step", (), np.dtype(np.int64)))
    n = sum(math.prod(s) for _, s in params)
    title = f"model-like: {n / 1e6:.1f}M bf16 weights + fp32 Adam m, v ({len(specs)} tensors)"
    return Workload("mixed", title, tuple(specs))


MANY_PARAMS = ("weight", "bias")
MANY_SLOTS = ("exp_avg", "exp_avg_sq", "step")
MANY_VALUES_PER_LAYER = len(MANY_PARAMS) * (1 + len(MANY_SLOTS))
MANY_LAYERS = (4_000, 16_000)
"""Default sizes of the ``many`` workload, in Linear(32, 32) layers (8 values each)."""
MANY_LAYERS_QUICK = (20, 80)


def many_workload(layers: int) -> Workload:
    """``layers`` Linear(32, 32) layers with AdamW state: 8 small values per layer (issue 28).

    Per layer, in torch's parameter order: ``model/<i>/weight`` (32×32), ``model/<i>/bias``
    (32), and per parameter AdamW's ``optim/<i>/<param>/exp_avg``, ``exp_avg_sq`` (same shape)
    and ``step`` (a float32 scalar, as torch keeps it). Names are the flat view every ``many``
    system maps to and from its own structure (a nested dict, a module and optimizer, a pytree).
    """
    f32 = np.dtype(np.float32)
    specs: list[TensorSpec] = []
    for i in range(layers):
        shapes = {"weight": (32, 32), "bias": (32,)}
        specs += [TensorSpec(f"model/{i}/{p}", shapes[p], f32) for p in MANY_PARAMS]
        for p in MANY_PARAMS:
            specs += [TensorSpec(f"optim/{i}/{p}/{slot}", () if slot == "step" else shapes[p],
                                 f32) for slot in MANY_SLOTS]
    title = (f"{layers:,} Linear(32, 32) layers + AdamW state "
             f"({layers * MANY_VALUES_PER_LAYER:,} values)")
    return Workload(f"many-{layers}", title, tuple(specs), kind="many")


def many_layer_count(key: str) -> int | None:
    """The layer count of a ``many-<layers>`` key, or None for any other key."""
    head, _, tail = key.partition("-")
    return int(tail) if head == "many" and tail.isdigit() and int(tail) > 0 else None


_FULL: dict[str, Callable[[], Workload]] = {
    "1gib": lambda: _uniform("1gib", "64 float32 tensors", 64, (2048, 2048), False),
    "small": lambda: _small(100_000),
    "small-dict": lambda: _small_dict(100_000),
    "mixed": lambda: _mixed(1024, 6, 16384),
    "4gib": lambda: _uniform("4gib", "64 float32 tensors", 64, (4096, 4096), True),
}
_QUICK: dict[str, Callable[[], Workload]] = {
    "1gib": lambda: _uniform("1gib", "64 float32 tensors", 64, (128, 256), False),
    "small": lambda: _small(1_000),
    "small-dict": lambda: _small_dict(1_000),
    "mixed": lambda: _mixed(64, 2, 512),
    "4gib": lambda: _uniform("4gib", "64 float32 tensors", 64, (256, 256), True),
}
WORKLOADS: tuple[str, ...] = (*_FULL, "many")
"""Workload keys in run order; ``4gib`` runs only with ``--big``; ``many`` stands for one
``many-<layers>`` workload per size (``many-4000``, ``many-16000`` by default)."""


def get_workload(key: str, *, quick: bool) -> Workload:
    """The workload ``key`` at full size, or tiny with ``quick``."""
    layers = many_layer_count(key)
    if layers is not None:
        return many_workload(layers)
    return (_QUICK if quick else _FULL)[key]()


def get_workloads(key: str, *, quick: bool,
                  many_layers: tuple[int, ...] | None = None) -> list[Workload]:
    """The workloads a ``--workloads`` key names: ``many`` gives one per size in ``many_layers``
    (default :data:`MANY_LAYERS`, or :data:`MANY_LAYERS_QUICK` with ``quick``)."""
    if key == "many":
        sizes = many_layers or (MANY_LAYERS_QUICK if quick else MANY_LAYERS)
        return [many_workload(n) for n in sizes]
    return [get_workload(key, quick=quick)]
