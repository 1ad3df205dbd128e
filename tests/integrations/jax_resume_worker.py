"""Subprocess worker for test_jax_resume.py: train a pure-JAX MLP with optax Adam, resume.

``python jax_resume_worker.py train DIR N M``: train N steps, save a checkpoint in the
background (``enable_async``) while training M more steps, write the trajectory after the save
to DIR/train.npz. ``python jax_resume_worker.py resume DIR N M``: build a fresh model with
another seed, ``tp.jax.restore`` DIR's latest checkpoint, train M steps, write DIR/resume.npz.
The state holds params (a list of dicts), Adam's namedtuple state, the step and a typed PRNG
key used for dropout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import trackpoint.integrations.jax as tpj
from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.saving import CheckpointOptions

OPTIMIZER = optax.adam(1e-2)
DATA_KEY = jax.random.key(1234)
SIZES = (4, 16, 3)


def init(seed: int) -> dict[str, Any]:
    keys = jax.random.split(jax.random.key(seed), len(SIZES))
    params = [
        {"w": jax.random.normal(k, (n_in, n_out)) / np.sqrt(n_in), "b": jnp.zeros(n_out)}
        for k, n_in, n_out in zip(keys, SIZES[:-1], SIZES[1:])
    ]
    return {
        "params": params,
        "opt_state": OPTIMIZER.init(params),
        "step": jnp.asarray(0, jnp.int32),
        "rng": jax.random.key(seed + 100),
    }


def loss_fn(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array,
            rng: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params[0]["w"] + params[0]["b"])
    keep = jax.random.bernoulli(rng, 0.8, h.shape)
    h = jnp.where(keep, h / 0.8, 0.0)
    out = h @ params[1]["w"] + params[1]["b"]
    return jnp.mean((out - y) ** 2)


@jax.jit
def train_step(state: dict[str, Any]) -> tuple[dict[str, Any], jax.Array]:
    batch_key = jax.random.fold_in(DATA_KEY, state["step"])
    x = jax.random.normal(batch_key, (32, SIZES[0]))
    y = jnp.stack([jnp.sin(x[:, 0]), x[:, 1] * x[:, 2], jnp.cos(x[:, 3])], axis=1)
    rng, dropout = jax.random.split(state["rng"])
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y, dropout)
    updates, opt_state = OPTIMIZER.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1,
            "rng": rng}, loss


def trajectory(state: dict[str, Any], steps: int) -> dict[str, np.ndarray]:
    losses = []
    for _ in range(steps):
        state, loss = train_step(state)
        losses.append(np.asarray(loss))
    out = {"losses": np.stack(losses), "rng": np.asarray(jax.random.key_data(state["rng"]))}
    for i, leaf in enumerate(jax.tree.leaves((state["params"], state["opt_state"],
                                              state["step"]))):
        out[f"leaf{i}"] = np.asarray(leaf)
    return out


def main(mode: str, directory: Path, first: int, then: int) -> None:
    if mode == "train":
        state = init(seed=0)
        for _ in range(first):
            state, _ = train_step(state)
        ckpt = Checkpoint(**state)
        ckpt.save(str(directory / "ckpt"), CheckpointOptions(enable_async=True))
        result = trajectory(state, then)  # trains while the checkpoint is written
        ckpt.sync()
    else:
        fresh = init(seed=1)
        state = tpj.restore(directory, fresh)
        assert int(state["step"]) == first, state["step"]
        result = trajectory(state, then)
    np.savez(directory / f"{mode}.npz", **result)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
