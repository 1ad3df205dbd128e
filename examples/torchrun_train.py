"""Train a model with a row-sharded embedding on N CPU processes, checkpointing with trackpoint.

Run (any number of processes; resume with another number, the checkpoint reshards)::

    torchrun --standalone --nproc_per_node=4 examples/torchrun_train.py --dir /tmp/tp-run --steps 50
    torchrun --standalone --nproc_per_node=2 examples/torchrun_train.py --dir /tmp/tp-run --steps 80

Each rank holds ``vocab / world`` rows of the embedding (tensor parallelism by hand: a lookup
is a masked local lookup summed over the ranks) and a replica of the MLP on top. Every
``--save-every`` steps all ranks save together: each writes its embedding rows and its share of
the replicated values, rank 0 merges and commits; a ``tp.CheckpointManager`` on every rank keeps
the newest ``--keep``. On start, the latest checkpoint in ``--dir`` is restored, whatever number
of processes wrote it. The checkpoint is a TensorFlow V2 checkpoint:
``tf.train.load_checkpoint`` (or ``tp.load_checkpoint``) sees the whole embedding.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import trackpoint as tp
import trackpoint.distributed as tpd


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum of every rank's tensor. Backward: the gradient as is, since every rank
    computes the same loss from the sum (so d loss / d own part = d loss / d sum)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad


class ShardedEmbedding(torch.nn.Module):
    """Rows ``[start, start + rows)`` of a ``vocab x dim`` embedding; lookups sum over ranks."""

    def __init__(self, vocab: int, dim: int, rank: int, world: int) -> None:
        super().__init__()
        base, extra = divmod(vocab, world)
        self.start = rank * base + min(rank, extra)
        rows = base + (1 if rank < extra else 0)
        full = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(0)) * 0.1
        self.weight = torch.nn.Parameter(full[self.start : self.start + rows].clone())
        # Saved as rows [start, start + rows) of the full (vocab, dim) tensor; Adam's state too.
        tpd.mark_sharded(self.weight, (vocab, dim), offsets=(self.start, 0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        found = self.weight[local.clamp(0, self.weight.shape[0] - 1)] * mine.unsqueeze(-1)
        return _SumOverRanks.apply(found)


class Model(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, rank: int, world: int) -> None:
        super().__init__()
        self.embedding = ShardedEmbedding(vocab, dim, rank, world)
        torch.manual_seed(1)  # the same replica of the MLP on every rank
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, dim), torch.nn.ReLU(), torch.nn.Linear(dim, 1)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embedding(ids).mean(dim=1)).squeeze(-1)


def batch(step: int, vocab: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch on every rank: a function of the step only, so a resumed run matches."""
    generator = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (size, 8), generator=generator)
    target = (ids % 7).float().mean(dim=1)
    return ids, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory (shared by ranks)")
    parser.add_argument("--steps", type=int, default=50, help="train until this step")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--async-save", action="store_true", help="save in the background")
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Model(args.vocab, args.dim, rank, world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step = tp.Variable(0, dtype="int64")
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, step=step)

    # On every rank: the coordinator (rank 0) writes the state file and deletes old checkpoints,
    # the other ranks follow it, so latest_checkpoint is the same everywhere.
    manager = tp.CheckpointManager(ckpt, args.dir, max_to_keep=args.keep)
    latest = manager.restore_or_initialize()  # None on the first run: nothing to restore
    if latest is not None and rank == 0:
        print(f"resumed from {latest} at step {int(step.numpy())} on {world} ranks")

    options = tp.CheckpointOptions(enable_async=args.async_save)
    loss = torch.tensor(0.0)
    while int(step.numpy()) < args.steps:
        ids, target = batch(int(step.numpy()), args.vocab)
        loss = torch.nn.functional.mse_loss(model(ids), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step.assign(int(step.numpy()) + 1)
        if int(step.numpy()) % args.save_every == 0 or int(step.numpy()) == args.steps:
            path = manager.save(options=options)
            if rank == 0:
                print(f"step {int(step.numpy())}: loss {loss.item():.4f}, saved {path}")
    ckpt.close()  # waits for a background save; before the process group goes away
    if rank == 0:
        print(f"done at step {int(step.numpy())}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
