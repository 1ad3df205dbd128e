"""Continuous checkpointing: save at every multiple of a step interval, and whenever idle between.

Orbax's ``ContinuousCheckpointingPolicy`` (combined with a ``FixedIntervalPolicy`` through
``AnySavePolicy``) is the model: with async saves, the cheapest moment to save is when the
previous write has finished, so a run that asks at every step saves as often as its storage
allows, and never waits for a write except at the steps it must keep (every ``interval_steps``).
``CheckpointManager(..., save_policy=tp.management.ContinuousCheckpointingPolicy(...))`` and
``manager.maybe_save(step)`` use it; TF's ``checkpoint_interval``/``step_counter`` are not
involved and keep their meaning for ``save()``.

Example::

    policy = tp.management.ContinuousCheckpointingPolicy(interval_steps=100)
    with tp.CheckpointManager(ckpt, "/ckpts", max_to_keep=3, save_policy=policy) as manager:
        for step in range(1, steps + 1):
            train_step()
            manager.maybe_save(step, options=tp.CheckpointOptions(enable_async=True))
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trackpoint.errors import InvalidArgumentError
from trackpoint.saving.options import CheckpointOptions

__all__ = ["ContinuousCheckpointingPolicy", "ContinuousSaves", "write_running"]


@dataclass(frozen=True, slots=True)
class ContinuousCheckpointingPolicy:
    """When ``CheckpointManager.maybe_save`` saves.

    Args:
        interval_steps: save at every step that is a multiple of this, even if a write is
            still running (the save then waits for it); None: no fixed steps.
        minimum_interval_secs: between the fixed steps, save only when no write is running
            and at least this many seconds passed since the last save began (0: whenever no
            write is running, Orbax's default).
    """

    interval_steps: int | None = None
    minimum_interval_secs: float = 0.0

    def __post_init__(self) -> None:
        if self.interval_steps is not None and (
            isinstance(self.interval_steps, bool)
            or not isinstance(self.interval_steps, int)
            or self.interval_steps < 1
        ):
            raise InvalidArgumentError(
                f"interval_steps must be a positive int or None, got {self.interval_steps!r}"
            )
        if (
            isinstance(self.minimum_interval_secs, bool)
            or not isinstance(self.minimum_interval_secs, (int, float))
            or not math.isfinite(self.minimum_interval_secs)
            or self.minimum_interval_secs < 0
        ):
            raise InvalidArgumentError(
                "minimum_interval_secs must be a finite number >= 0, got "
                f"{self.minimum_interval_secs!r}"
            )

    def should_save(
        self,
        step: int,
        *,
        last_saved_step: int | None,
        write_running: bool,
        seconds_since_last_save: float | None,
    ) -> bool:
        """Whether to save ``step`` (each step is saved at most once)."""
        if last_saved_step is not None and step <= last_saved_step:
            return False
        if self.interval_steps is not None and step % self.interval_steps == 0:
            return True
        if write_running:
            return False
        return seconds_since_last_save is None or (
            seconds_since_last_save >= self.minimum_interval_secs
        )


class _Saving(Protocol):
    """What :class:`ContinuousSaves` needs of a manager."""

    @property
    def checkpoint(self) -> Any: ...

    def save(
        self,
        checkpoint_number: Any = None,
        check_interval: bool = True,
        options: CheckpointOptions | None = None,
    ) -> str | None: ...


def write_running(checkpoint: Any) -> bool:
    """True while ``checkpoint`` (a ``tp.Checkpoint``) has an async write in the background."""
    writer = getattr(checkpoint, "_self_async", None)  # the Checkpoint's AsyncWriter, if any
    return bool(writer is not None and writer.pending)


class ContinuousSaves:
    """A manager's continuous-checkpointing state: the last saved step and when it began.

    Args:
        policy: when to save.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        policy: ContinuousCheckpointingPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(policy, ContinuousCheckpointingPolicy):
            raise InvalidArgumentError(
                "save_policy must be a tp.ContinuousCheckpointingPolicy, got "
                f"{type(policy).__name__}"
            )
        self.policy = policy
        self._clock = clock
        self.last_saved_step: int | None = None
        self._last_save_time: float | None = None

    def should_save(self, step: int, checkpoint: Any) -> bool:
        """The policy's answer for ``step`` now."""
        since = None if self._last_save_time is None else self._clock() - self._last_save_time
        return self.policy.should_save(
            step,
            last_saved_step=self.last_saved_step,
            write_running=write_running(checkpoint),
            seconds_since_last_save=since,
        )

    def maybe_save(
        self, manager: _Saving, step: int, options: CheckpointOptions | None = None
    ) -> str | None:
        """Save ``<checkpoint_name>-<step>`` through ``manager`` if the policy says so.

        Returns:
            The new prefix, or None when the policy skipped the step.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be a non-negative int, got {step!r}")
        if not self.should_save(step, manager.checkpoint):
            return None
        started = self._clock()
        prefix = manager.save(checkpoint_number=step, check_interval=False, options=options)
        if prefix is not None:
            self.last_saved_step = step
            self._last_save_time = started
        return prefix
