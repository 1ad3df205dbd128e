"""Subprocess worker for test_torch_resume.py: train, checkpoint, resume in a fresh process.

``python torch_resume_worker.py train DIR N M``: train N steps, save a checkpoint (async: the
snapshot is taken while training goes on), train M more, write the trajectory to DIR/train.npz.
``python torch_resume_worker.py resume DIR N M``: build everything fresh with other seeds,
restore DIR's latest checkpoint, train M steps, write DIR/resume.npz.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn

import trackpoint.checkpoint as tp_checkpoint
from trackpoint.integrations.torch import TorchRNG
from trackpoint.management.state_file import latest_checkpoint
from trackpoint.saving import CheckpointOptions


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU())
        self.mlp = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * 4 * 4, 12), nn.ReLU(), nn.Dropout(0.25), nn.Linear(12, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.conv(x))


def build(seed: int) -> dict:
    torch.manual_seed(seed)
    model = Model()
    adam = torch.optim.Adam(model.conv.parameters(), lr=0.01)
    sgd = torch.optim.SGD(model.mlp.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(sgd, step_size=3, gamma=0.7)
    data = torch.Generator().manual_seed(seed + 1)
    return {"model": model, "adam": adam, "sgd": sgd, "scheduler": scheduler, "data": data,
            "rng": TorchRNG()}


def step(state: dict) -> float:
    model = state["model"]
    model.train()
    x = torch.randn(8, 1, 6, 6, generator=state["data"])
    y = torch.randint(0, 3, (8,), generator=state["data"])
    state["adam"].zero_grad()
    state["sgd"].zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    state["adam"].step()
    state["sgd"].step()
    state["scheduler"].step()
    return float(loss.item())


def finish(state: dict, losses: list[float], path: str) -> None:
    arrays = {f"param:{k}": v.detach().numpy() for k, v in state["model"].state_dict().items()}
    for name in ("adam", "sgd"):
        optimizer = state[name]
        for i, group in enumerate(optimizer.param_groups):
            arrays[f"{name}:lr:{i}"] = np.array(group["lr"])
            for j, p in enumerate(group["params"]):
                for key, value in optimizer.state[p].items():
                    arrays[f"{name}:{i}:{j}:{key}"] = value.numpy()
    arrays["losses"] = np.array(losses, dtype=np.float64)
    arrays["next_random"] = torch.rand(4).numpy()
    np.savez(path, **arrays)


def main(mode: str, directory: str, first: int, then: int) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if mode == "train":
        state = build(seed=0)
        losses = [step(state) for _ in range(first)]
        ckpt = tp_checkpoint.Checkpoint(**state)
        ckpt.save(f"{directory}/ckpt", CheckpointOptions(enable_async=True))
        losses += [step(state) for _ in range(then)]  # training goes on during the write
        ckpt.sync()
        finish(state, losses[first:], f"{directory}/train.npz")
    else:
        state = build(seed=12345)
        status = tp_checkpoint.Checkpoint(**state).restore(latest_checkpoint(directory))
        status.assert_consumed()
        losses = [step(state) for _ in range(then)]
        finish(state, losses, f"{directory}/resume.npz")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
