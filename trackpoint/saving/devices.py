"""Devices and tasks: where a value lives, and which process writes it.

TensorFlow groups the tensors of a checkpoint by *task*: the tensor's device with the device part
replaced by ``CPU:0`` (tf-checkpoint-format.md §12). Every task writes its own shards, which are
then merged into one prefix. trackpoint keeps TF's device strings for multi-host setups and maps
everything that lives on this process (``None``, ``"cpu"``, ``"cuda:1"``, ``"/device:GPU:0"``,
``/job:localhost/...``) to one local task, so a single host writes one data file by default.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError

__all__ = ["LOCAL_TASK", "DeviceValue", "task_of"]

LOCAL_TASK = ""
"""The task of every value that lives on this process (TF's ``/job:localhost/replica:0/task:0``)."""

# One "/name:value" component of a TF device string; the device part may be "device:GPU:0",
# "GPU:0" or "gpu:0" (DeviceSpec accepts all three).
_COMPONENT = re.compile(r"^(job|replica|task):(.+)$")


@dataclass(frozen=True, slots=True)
class DeviceValue:
    """A value to save together with the device it lives on.

    ``MultiDeviceSaver`` accepts it wherever it accepts a value. Only the task part of
    ``device`` matters for grouping (``/job:w/task:1/device:GPU:0`` -> task ``/job:w/task:1``).
    """

    value: np.ndarray | Callable[[], Any] | None
    """An array, a zero-argument callable returning one (evaluated once per save), or None."""
    device: str | None
    """A TF device string (``/job:w/task:1/device:GPU:0``) or a local one (``cpu``, ``cuda:0``)."""


def task_of(device: str | None) -> str:
    """Return the task a value on ``device`` belongs to.

    Args:
        device: a TF device string or a local device name; None means this process.

    Returns:
        ``"/job:<job>[/replica:<r>]/task:<t>"`` for a device that names a job other than
        ``localhost``, else :data:`LOCAL_TASK`.

    Raises:
        InvalidArgumentError: ``device`` is not a string.
    """
    if device is None:
        return LOCAL_TASK
    if not isinstance(device, str):
        raise InvalidArgumentError(
            f"device must be a str such as '/job:worker/task:1/device:CPU:0' or 'cuda:0', "
            f"got {type(device).__name__}"
        )
    parts: dict[str, str] = {}
    for component in device.strip().split("/"):
        match = _COMPONENT.match(component.strip())
        if match:
            parts[match.group(1)] = match.group(2)
    job = parts.get("job")
    if job is None or job == "localhost":
        return LOCAL_TASK
    task = f"/job:{job}"
    if "replica" in parts:
        task += f"/replica:{parts['replica']}"
    return f"{task}/task:{parts.get('task', '0')}"
