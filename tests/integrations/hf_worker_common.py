"""Tiny GPT-2 and Llama models and data shared by the Hugging Face subprocess workers.

Built from configs (no downloads): 2 layers, hidden size 32, vocabulary 128, dropout on where
the architecture has it, so a resumed run matches only if the RNG states were restored too.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import numpy as np
import torch

SAMPLES, LENGTH, BATCH = 24, 16, 4  # 6 steps per epoch
STEPS, SAVE_EVERY, KILL_AT = 8, 2, 6  # saves at 2, 4, 6, 8; killed while writing step 6


def deterministic() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def build_model(kind: str, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "gpt2":
        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=LENGTH,
                            bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1,
                            attn_pdrop=0.1)
        return GPT2LMHeadModel(config)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=LENGTH, bos_token_id=0, eos_token_id=0,
                         attention_dropout=0.1)
    return LlamaForCausalLM(config)


class TokenData(torch.utils.data.Dataset):
    """Fixed random token sequences; labels are the inputs (causal LM)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(7)
        self.tokens = torch.from_numpy(rng.integers(1, 128, (SAMPLES, LENGTH)))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def killer(directory_name: str):
    """A progress callback that SIGKILLs the process while ``directory_name`` is written.

    ``"write"`` comes after a shard is persisted and before the checkpoint is committed.
    """

    def progress(event) -> None:
        if event.phase == "write" and f".{directory_name}.trackpoint-partial" in event.prefix:
            os.kill(os.getpid(), signal.SIGKILL)

    return progress


def record(path: str, model: torch.nn.Module, optimizer, scheduler, losses: list) -> None:
    """Everything a later step depends on, for a byte-for-byte comparison."""
    arrays = {f"param:{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    for g, group in enumerate(optimizer.param_groups):
        arrays[f"opt:{g}:lr"] = np.array(group["lr"], dtype=np.float64)
        for i, param in enumerate(group["params"]):
            for key, value in optimizer.state[param].items():
                arrays[f"opt:{g}:{i}:{key}"] = value.numpy()
    arrays["lr"] = np.array(scheduler.get_last_lr(), dtype=np.float64)
    arrays["losses"] = np.array(losses, dtype=np.float64)
    arrays["next_torch"] = torch.rand(4).numpy()
    arrays["next_numpy"] = np.random.rand(4)
    arrays["next_python"] = np.array([random.random() for _ in range(4)])
    np.savez(path, **arrays)


def assert_same_records(full_path, resumed_path) -> None:
    """Every recorded array of the resumed run equals the uninterrupted run's, byte for byte."""
    with np.load(full_path) as full, np.load(resumed_path) as resumed:
        assert sorted(full.files) == sorted(resumed.files)
        assert any(":exp_avg_sq" in name for name in full.files)
        assert len(full["losses"]) == STEPS - (KILL_AT - SAVE_EVERY)
        for name in full.files:
            a, b = full[name], resumed[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name


def run_worker(worker: str, mode: str, directory: object, kinds: str
               ) -> subprocess.CompletedProcess:
    """Run ``worker`` (a script beside this one) in a process of its own, offline: there is
    no model hub here, every model is built from its config."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, worker, mode, str(directory), kinds],
                          capture_output=True, text=True, timeout=600, env=env)
