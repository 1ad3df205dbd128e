"""Ranks as threads: one ``tpd.ThreadGroup``, one thread per rank (for the thread-based tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trackpoint.distributed as tpd


def run_ranks(
    world: int, work: Callable[[int, tpd.Collective], Any], *, join_seconds: float = 60
) -> list[Any]:
    """``work(rank, collective)`` on ``world`` threads named ``rank<r>``; each rank's result
    or exception."""
    group = tpd.ThreadGroup(world, timeout=20)
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
