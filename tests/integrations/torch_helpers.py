"""Shared pieces for the torch integration tests: small models, a training loop, key listing."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trackpoint.management import CheckpointReader

# Every torch dtype with a bundle dtype, with a sample value (ml_dtypes/bit patterns included).
DTYPES = [
    torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.bool, torch.complex64, torch.complex128, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
]


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (3, 4), seed: int = 0) -> torch.Tensor:
    """A tensor of ``dtype`` with varied values (distinct per seed)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator) * 4).to(dtype)
    high = 100 if dtype != torch.uint8 else 255
    return torch.randint(0, high, shape, generator=generator).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe, works for float8/bfloat16)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}
    if a.dtype.is_complex:
        return torch.equal(torch.view_as_real(a.contiguous()), torch.view_as_real(b.contiguous()))
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(width[a.element_size()]),
                       b.contiguous().view(width[b.element_size()]))


class Net(nn.Module):
    """A small conv + MLP model (with batch norm buffers and dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 16), nn.ReLU(),
                                 nn.Dropout(0.2), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.conv(x))


def checkpoint_keys(prefix: str) -> list[str]:
    with CheckpointReader(prefix) as reader:
        return reader.keys()


def checkpoint_value(prefix: str, key: str) -> np.ndarray:
    with CheckpointReader(prefix) as reader:
        return reader.get_tensor(key)
