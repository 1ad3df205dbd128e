"""Ranks as threads: one ``tpd.ThreadGroup``, one thread per rank (for the thread-based tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trackpoint.distributed as tpd

try:
    import jobs
except ImportError:  # imported as tests.distributed.thread_ranks (test_without_torch.py)
    from tests.distributed import jobs


def run_ranks(
    world: int, work: Callable[[int, tpd.Collective], Any], *, join_seconds: float | None = None
) -> list[Any]:
    """``work(rank, collective)`` on ``world`` threads named ``rank<r>``; each rank's result
    or exception. Timeouts are sized for a loaded machine (jobs.py)."""
    group = tpd.ThreadGroup(world, timeout=jobs.COLLECTIVE_SECONDS / 5)
    join_seconds = jobs.COLLECTIVE_SECONDS if join_seconds is None else join_seconds
    results: list[Any] = [None] * world

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank, group.collective(rank))
        except BaseException as exc:  # noqa: BLE001  (returned to the test)
            results[rank] = exc

    threads = [threading.Thread(target=target, args=(r,), name=f"rank{r}") for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(join_seconds)
    assert not any(t.is_alive() for t in threads), "a rank is stuck"
    return results
