"""The torch tensor adapter's batch forms (issue 28): ``_prepare_restores``, ``_serialize_many``
and ``_whole_value_names``, reached as the engines reach them, through ``batch_hook``.

The batch forms must answer exactly as the per-object methods do: the same checks and messages
(B8), all or nothing (no tensor changes when one value does not fit), copies in place (B3), lazy
parameters kept pending (B1), the same host views on save.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_helpers import DTYPES, same, sample  # noqa: E402

from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402
from trackpoint.integrations.torch import TensorVariable, to_numpy  # noqa: E402
from trackpoint.tracking import to_trackable  # noqa: E402
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, batch_hook  # noqa: E402


def _adapters(tensors):
    adapters = [to_trackable(tensor) for tensor in tensors]
    assert all(type(adapter) is TensorVariable for adapter in adapters)
    return adapters


def _read_only(array: np.ndarray) -> np.ndarray:
    array = np.array(array, copy=True)
    array.setflags(write=False)  # as a view of a checkpoint file is
    return array


def _raise_as_given(index, exc):
    return RuntimeError(f"object {index}: {exc}")


def _prepare(adapters, values, on_error=_raise_as_given):
    prepare = batch_hook(TensorVariable, "_prepare_restores")
    return prepare(adapters, [{VARIABLE_VALUE_KEY: v} for v in values], on_error)


def test_every_tensor_saves_one_whole_value():
    assert batch_hook(TensorVariable, "_whole_value_names") == (VARIABLE_VALUE_KEY,)
    for tensor in [torch.zeros(3), nn.Parameter(torch.ones(2, 2)), sample(torch.bfloat16)]:
        assert list(to_trackable(tensor)._serialize_to_tensors()) == [VARIABLE_VALUE_KEY]


def test_b3_prepare_restores_copies_every_dtype_in_place():
    targets = [sample(dtype, seed=1) for dtype in DTYPES]
    targets += [nn.Parameter(torch.zeros(4, 3)), torch.zeros(()), torch.zeros(5, 4)[:, 1]]
    saved = [sample(dtype, seed=2) for dtype in DTYPES]
    saved += [torch.randn(4, 3), torch.tensor(7.0), torch.arange(5.0)]
    pointers = [t.data_ptr() for t in targets]
    versions = [t._version for t in targets]
    apply = _prepare(_adapters(targets), [_read_only(to_numpy(s)) for s in saved])
    assert not any(same(t, s) for t, s in zip(targets, saved))  # nothing changed yet
    apply()
    for target, value, pointer, version in zip(targets, saved, pointers, versions):
        assert same(target, value)
        assert target.data_ptr() == pointer  # the same storage
        assert target._version > version  # autograd sees the change
        assert target.grad_fn is None
    assert targets[len(DTYPES)].requires_grad  # the parameter is still a parameter


def test_b8_one_value_that_does_not_fit_restores_nothing():
    targets = [torch.zeros(3), torch.zeros(2, 2), torch.zeros(4)]
    values = [np.ones(3, np.float32), np.ones((3, 2), np.float32), np.ones(4, np.float32)]
    with pytest.raises(RuntimeError, match=r"object 1: Received incompatible tensor with shape"):
        _prepare(_adapters(targets), values)
    values[1] = np.ones((2, 2), np.float64)
    with pytest.raises(RuntimeError, match=r"object 1: Received tensor of dtype float64"):
        _prepare(_adapters(targets), values)
    assert all(not t.any() for t in targets)


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized, complex32: "experimental"
def test_b8_batch_and_per_object_checks_say_the_same():
    cases = [
        (torch.zeros(3), np.ones(4, np.float32)),  # shape
        (torch.zeros(3), np.ones(3, np.int32)),  # dtype
        (torch.zeros(1).expand(3), np.ones(3, np.float32)),  # several elements, one location
    ]
    with torch.inference_mode():
        cases.append((torch.zeros(3), np.ones(3, np.float32)))  # an inference tensor
    # No bundle dtype: float64 must not pass for "no dtype" (np.dtype(None) is float64).
    cases.append((torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8),
                  np.ones(3, np.float64)))
    cases.append((torch.zeros(3, dtype=torch.complex32), np.ones(3, np.float64)))
    cases.append((torch.zeros(3).to_sparse(), np.ones(3, np.float32)))  # not dense
    for tensor, value in cases:
        (adapter,) = _adapters([tensor])
        with pytest.raises(InvalidArgumentError) as single:
            adapter._prepare_restore({VARIABLE_VALUE_KEY: value})
        errors = []

        def keep(index, exc, errors=errors):
            errors.append((index, exc))
            return ValueError("refused")

        # Alone, and amid tensors that fit: the same message, for its own index.
        before, after = torch.zeros(2), torch.zeros(4)
        batch = [(before, np.ones(2, np.float32)), (tensor, value), (after, np.ones(4, np.float32))]
        for adapters, values, index in [
            ([adapter], [value], 0),
            (_adapters([t for t, _ in batch]), [v for _, v in batch], 1),
        ]:
            errors.clear()
            with pytest.raises(ValueError, match="refused"):
                _prepare(adapters, values, keep)
            assert [(i, str(e)) for i, e in errors] == [(index, str(single.value))]
        assert not before.any() and not after.any()


class _Tagged(torch.Tensor):
    """A tensor subclass (checked one by one, as any type the batch does not know)."""


def test_b3_a_batch_of_usual_and_unusual_tensors_restores_them_all():
    # One-element expanded view (allowed), a tensor subclass, a strided view, plain tensors.
    expanded = torch.zeros(1).expand(1)
    subclass = torch.zeros(2).as_subclass(_Tagged)
    targets = [torch.zeros(3), expanded, subclass, torch.zeros(4, 4)[1:, ::2], torch.zeros(())]
    values = [np.full(t.shape, i + 1.0, np.float32) for i, t in enumerate(targets)]
    _prepare(_adapters(targets), [_read_only(v) for v in values])()
    for target, value in zip(targets, values):
        np.testing.assert_array_equal(target.numpy(), value)


def test_b1_lazy_parameters_in_a_batch_wait_for_materialization():
    lazy = nn.LazyLinear(2)
    plain = torch.zeros(3)
    weight, bias = np.full((2, 4), 3.0, np.float32), np.full(2, 4.0, np.float32)
    adapters = _adapters([lazy.weight, plain, lazy.bias])
    assert "uninitialized" in repr(adapters[0])  # no shape to show yet (and no error)
    apply = _prepare(adapters, [weight, np.ones(3, np.float32), bias])
    apply()
    assert torch.equal(plain, torch.ones(3))
    np.testing.assert_array_equal(adapters[0].pending_value, weight)
    np.testing.assert_array_equal(adapters[2].pending_value, bias)


def test_serialize_many_gives_what_serialize_to_tensors_gives():
    tensors = [sample(dtype, seed=3) for dtype in DTYPES]
    tensors += [
        nn.Parameter(torch.randn(3, 3)),
        torch.randn(4, 4)[::2, 1:],  # strided view
        torch.randn(3, dtype=torch.complex64).conj(),  # a conjugate view (resolved: a copy)
        torch.randn(3).neg().conj(),
    ]
    adapters = _adapters(tensors)
    many = batch_hook(TensorVariable, "_serialize_many")(adapters)
    assert len(many) == len(adapters)
    for adapter, got in zip(adapters, many):
        expected = adapter._serialize_to_tensors()
        assert list(got) == list(expected) == [VARIABLE_VALUE_KEY]
        a, b = got[VARIABLE_VALUE_KEY], expected[VARIABLE_VALUE_KEY]
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
        if not adapter.tensor.is_conj() and not adapter.tensor.is_neg():
            # a view of the tensor's memory (a resolved conjugate is a fresh copy each time)
            assert a.__array_interface__["data"][0] == adapter.tensor.data_ptr()


def test_serialize_many_of_an_uninitialized_parameter_is_its_error():
    lazy = nn.LazyLinear(2)
    (got,) = batch_hook(TensorVariable, "_serialize_many")(_adapters([lazy.weight]))
    assert callable(got[VARIABLE_VALUE_KEY])  # raises when the saver evaluates it


def test_a_restore_warns_about_nothing_read_only(tmp_path):
    # torch warns about read-only numpy arrays once per process; the restore silences it, in a
    # fresh process where it has not been given yet, and every restore after it stays silent.
    code = f"""
import warnings, torch, numpy as np
import trackpoint as tp
from trackpoint.integrations.torch import copy_into
warnings.simplefilter("error")
saved = torch.nn.Linear(3, 2)
path = tp.Checkpoint(m=saved).write({str(tmp_path / "ckpt")!r})
for _ in range(3):
    fresh = torch.nn.Linear(3, 2)
    tp.Checkpoint(m=fresh).read(path).assert_consumed()
    assert torch.equal(fresh.weight, saved.weight)
view = np.ones(3, np.float32)
view.setflags(write=False)
target = torch.zeros(3)
copy_into(target, view)
assert torch.equal(target, torch.ones(3))
print("quiet")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "quiet"


def test_b3_checkpoint_round_trip_of_a_model_and_optimizer(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    fresh = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    Checkpoint(model=fresh, optimizer=fresh_optimizer).read(path).assert_consumed()
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), fresh.parameters()):
        for key, value in optimizer.state[a].items():
            assert torch.equal(value, fresh_optimizer.state[b][key]), key
