"""One rank of a distributed test: ``dist_worker.py SCENARIO WORKDIR [ARGS]``.

Started by ``dist_helpers.launch`` with RANK, WORLD_SIZE and TP_INIT_FILE set. A rank exits 0
after its checks passed; anything else is a failure the test reports with this rank's output.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import jobs
import numpy as np
import torch
import torch.distributed as dist
from dist_helpers import build, key, reference, train_step

import trackpoint as tp
import trackpoint.distributed as tpd
from trackpoint.errors import CheckpointError

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TIMEOUT = jobs.collective_timeout()  # sized for a loaded machine (jobs.py)


def init() -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{os.environ['TP_INIT_FILE']}", rank=RANK, world_size=WORLD,
        timeout=timedelta(seconds=jobs.collective_timeout()),
    )  # fmt: skip


def same_everywhere(value: str) -> None:
    values = [None] * WORLD
    dist.all_gather_object(values, value)
    assert values == [value] * WORLD, values


def check(model, optimizer, expected: dict[str, np.ndarray]) -> None:  # noqa: ANN001
    """This rank's parameters and Adam slots equal its parts of the full ``expected`` values."""
    for name, param in model.named_parameters():
        np.testing.assert_array_equal(
            model.local(name).numpy(), model.part(name, expected[key(name)]), err_msg=name
        )
        for slot in ("exp_avg", "exp_avg_sq"):
            state = optimizer.state[param][slot]
            local = state.to_local() if hasattr(state, "to_local") else state
            np.testing.assert_array_equal(
                local.numpy(), model.part(name, expected[key(name, slot)]), err_msg=f"{name} {slot}"
            )


def shifted(expected: dict[str, np.ndarray], delta: float) -> dict[str, np.ndarray]:
    """``expected`` with every parameter (not the slots) moved by ``delta``."""
    return {k: v + np.float32(delta) if "OPTIMIZER_SLOT" not in k else v
            for k, v in expected.items()}


def add_to_params(model, delta: float) -> None:  # noqa: ANN001
    with torch.no_grad():
        for param in model.parameters():
            param.add_(delta)


def save(workdir: Path) -> None:
    """ckpt-1 (sync), ckpt-2 (async, values changed right after), then a save a rank fails."""
    model, optimizer = build(RANK, WORLD, 1, dtensor=True)
    train_step(model, optimizer)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    directory = workdir / "ckpts"
    first = ckpt.save(directory / "ckpt")
    same_everywhere(first)
    check(model, optimizer, reference(1))

    add_to_params(model, 1.0)
    second = ckpt.save(directory / "ckpt", tp.CheckpointOptions(enable_async=True))
    add_to_params(model, 100.0)  # after the snapshot: must not reach ckpt-2
    ckpt.sync()
    add_to_params(model, -100.0)
    same_everywhere(second)
    assert tp.latest_checkpoint(directory) == second

    def policy(tensors):  # noqa: ANN001, ANN202
        if RANK == 2:
            raise RuntimeError("boom on rank 2")
        return tp.sharding.ShardByTaskPolicy()(tensors)

    error: BaseException | None = None
    try:
        ckpt.save(directory / "ckpt", tp.CheckpointOptions(sharding_policy=policy))
    except (CheckpointError, RuntimeError) as exc:
        error = exc
    if RANK == 2:  # its own exception; the others learn of it
        assert type(error) is RuntimeError and "boom" in str(error), error
    else:
        assert isinstance(error, CheckpointError), error
        assert "rank 2: RuntimeError: boom on rank 2" in str(error), error
    dist.barrier()
    assert tp.latest_checkpoint(directory) == second
    assert not (directory / "ckpt-3.index").exists()
    assert not [p for p in directory.iterdir() if "_temp_" in p.name], list(directory.iterdir())
    ckpt.close()


def restore(workdir: Path, source: str) -> None:
    """Restore ckpt-2 of ``save`` on this world size, then save it again with this layout."""
    model, optimizer = build(RANK, WORLD, 7, dtensor=True)  # other values, no optimizer state
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    status = ckpt.restore(source)
    status.assert_existing_objects_matched()
    expected = shifted(reference(1), 1.0)
    check(model, optimizer, expected)
    assert int(ckpt.save_counter.numpy()) == 2

    # The same state, saved with this world size's layout, is the same checkpoint content.
    path = ckpt.write(workdir / f"resaved-{WORLD}" / "ckpt")
    same_everywhere(path)
    if RANK == 0:
        reader = tp.load_checkpoint(path)
        for k, value in expected.items():
            np.testing.assert_array_equal(reader.get_tensor(k), value, err_msg=k)


def kill(workdir: Path, victim: str) -> None:
    """ckpt-1 is saved; then rank ``victim`` dies in the middle of saving ckpt-2."""
    model, optimizer = build(RANK, WORLD, 1, dtensor=False)
    train_step(model, optimizer)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    directory = workdir / "ckpts"
    ckpt.save(directory / "ckpt")

    def policy(tensors):  # noqa: ANN001, ANN202
        if RANK == int(victim):
            sys.stdout.flush()
            os._exit(3)  # dies after the temporary folder exists, before anything is committed
        return tp.sharding.ShardByTaskPolicy()(tensors)

    started = time.monotonic()
    try:
        ckpt.save(directory / "ckpt", tp.CheckpointOptions(sharding_policy=policy))
    except CheckpointError as exc:
        print(f"save failed after {time.monotonic() - started:.1f} s: {exc}")
    else:
        raise AssertionError("a save whose rank died succeeded")


def manager(workdir: Path) -> None:
    """CheckpointManager on every rank (sync and async saves), the figures each process
    records, then a rank that stays alive but never joins a save (timeout 3 s)."""
    from trackpoint import metrics

    directory = workdir / "managed"
    model, optimizer = build(RANK, WORLD, 1, dtensor=False)
    train_step(model, optimizer)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    # Messages longer than one exchange's frame (1 KiB) take a second round trip.
    long = {"rank": RANK, "text": "x" * (3000 + 500 * RANK)}
    assert ckpt.collective.all_gather(long) == [
        {"rank": r, "text": "x" * (3000 + 500 * r)} for r in range(WORLD)]
    assert ckpt.collective.broadcast(long if RANK == 1 else None, 1) == {
        "rank": 1, "text": "x" * 3500}
    assert ckpt.collective.all_gather(RANK) == list(range(WORLD))
    managed = tp.CheckpointManager(ckpt, directory, max_to_keep=2)
    assert managed.restore_or_initialize() is None
    metrics.reset()
    managed.save()
    managed.save(options=tp.CheckpointOptions(enable_async=True))
    managed.sync()
    last = managed.save()
    same_everywhere(f"{last} {managed.latest_checkpoint} {managed.checkpoints}")
    assert managed.latest_checkpoint == last == str(directory / "ckpt-3"), last
    assert managed.checkpoints == [str(directory / f"ckpt-{n}") for n in (2, 3)]
    assert sorted(p.name for p in directory.glob("*.index")) == ["ckpt-2.index", "ckpt-3.index"]
    figures = metrics.snapshot()
    sizes = figures[metrics.CHECKPOINT_SIZE]
    assert (sizes[()]["count"] if sizes else 0) == (3 if RANK == 0 else 0), sizes
    durations = figures[metrics.WRITE_DURATION]
    assert durations[(("mode", "sync"), ("phase", "blocking"))]["count"] == 2, durations
    assert durations[(("mode", "async"), ("phase", "background"))]["count"] == 1, durations

    managed.close()  # one open manager per directory and process (issue 27 finding 10)
    model, optimizer = build(RANK, WORLD, 5, dtensor=False)
    again = tp.CheckpointManager(
        tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT), directory,
        max_to_keep=2,
    )
    assert again.restore_or_initialize() == last
    expected = {k: v for k, v in reference(1).items() if "/dt/" not in k}
    check(model, optimizer, expected)

    stalled = tpd.DistributedCheckpoint(model=model, timeout=3)  # creating it is collective
    marker = workdir / "stall-done"
    if RANK == 0:
        started = time.monotonic()
        try:
            stalled.write(workdir / "stalled" / "ckpt")
        except tpd.CollectiveError as exc:
            print(f"stalled save failed after {time.monotonic() - started:.1f} s: {exc}")
        else:
            raise AssertionError("a save that rank 1 never joined succeeded")
        marker.touch()
    else:  # alive, answering nothing, until rank 0 has given up
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not (workdir / "stalled" / "ckpt.index").exists()


def s3(workdir: Path, root: str) -> None:
    """Save on S3 (fsspec), then restore into other values with coalesced reads."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", skip_instance_cache=True,
        client_kwargs={"endpoint_url": os.environ["TP_S3_ENDPOINT"], "region_name": "us-east-1"},
    )
    from trackpoint.storage import FsspecStorage

    options = tp.CheckpointOptions(storage=FsspecStorage(fs))
    model, optimizer = build(RANK, WORLD, 1, dtensor=False)
    train_step(model, optimizer)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    path = ckpt.save(f"{root}/ckpt", options)
    same_everywhere(path)

    model, optimizer = build(RANK, WORLD, 5, dtensor=False)
    ckpt = tpd.DistributedCheckpoint(model=model, optimizer=optimizer, timeout=TIMEOUT)
    ckpt.restore(root, options).assert_existing_objects_matched()
    expected = {k: v for k, v in reference(1).items() if "/dt/" not in k}
    check(model, optimizer, expected)


def main() -> int:
    scenario, workdir, *args = sys.argv[1:]
    init()
    try:
        scenarios = {"save": save, "restore": restore, "kill": kill, "s3": s3, "manager": manager}
        scenarios[scenario](Path(workdir), *args)
    finally:
        if scenario not in ("kill", "manager"):  # their groups are broken on purpose
            dist.destroy_process_group()
    print(f"rank {RANK}: OK", flush=True)
    if scenario in ("kill", "manager"):
        # Torch's teardown of a gloo group broken on purpose can abort the process at exit
        # ("terminate called without an active exception"); the scenario is over, so skip it.
        logging.shutdown()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
