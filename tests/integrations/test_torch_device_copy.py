"""Device-to-host copies of lazy snapshots (issue 29): pinned reused buffers, ordering.

The ordering logic runs on CPU tensors through ``CpuStreams`` (copies run when waited for, as
a device runs them later); the CUDA test runs where a GPU exists.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trackpoint.errors import FailedPreconditionError
from trackpoint.integrations.torch_device_copy import CpuStreams, CudaStreams, DeviceCopier


def test_host_buffers_are_reused_from_save_to_save_and_replaced_when_the_shape_changes():
    copier = DeviceCopier(CpuStreams())
    weight = torch.randn(4, 3)
    first = copier.issue("w", weight)
    np.testing.assert_array_equal(first.result(), weight.numpy())
    second = copier.issue("w", weight)
    assert second.buffer is first.buffer
    np.testing.assert_array_equal(second.result(), weight.numpy())
    assert copier.issue("w", torch.randn(2, 3)).buffer is not first.buffer
    assert copier.issue("b", weight).buffer is not first.buffer


def test_the_step_gate_orders_the_optimizer_change_after_the_copy():
    weight = torch.arange(6, dtype=torch.float32)
    at_call = weight.clone()
    copy = DeviceCopier(CpuStreams()).issue("w", weight)
    copy.order_before_step()  # the optimizer's step pre-hook
    weight.add_(1)  # the step itself
    np.testing.assert_array_equal(copy.result(), at_call.numpy())


def test_a_change_outside_a_gated_step_fails_the_copy():
    weight = torch.arange(6, dtype=torch.float32)
    copy = DeviceCopier(CpuStreams()).issue("w", weight)
    weight.mul_(2)  # an EMA-like change issued before the copy ran
    with pytest.raises(FailedPreconditionError, match="w failed: the device tensor changed"):
        copy.result()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copy_is_pinned_reused_and_ordered_before_the_step():
    device = torch.device("cuda")
    weight = torch.randn(1024, 1024, device=device)
    at_call = weight.cpu()
    copier = DeviceCopier(CudaStreams(device))
    copy = copier.issue("w", weight)
    assert copy.buffer.is_pinned()
    copy.order_before_step()
    weight.add_(1)  # queued on the current stream after the copy's done event
    np.testing.assert_array_equal(copy.result(), at_call.numpy())
    assert copier.issue("w", weight).buffer is copy.buffer
