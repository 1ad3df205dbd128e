"""A view saved again replays its walk with optimizer slots too (issue 28), exactly: an added
slot, a new optimizer state entry, a replaced state tensor, a new parameter group each make the
next save walk again, and every save equals the save of a brand-new view of the same objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from graph_checks import assert_same, fresh, values_of

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph import ObjectGraphView, serialize_graph
from trackpoint.tracking import AutoTrackable, SlotOwner, Variable

torch = pytest.importorskip("torch")


class Opt(SlotOwner, AutoTrackable):
    pass


_KEEP: list[Any] = []


def _torch_view() -> tuple[Any, Any, ObjectGraphView]:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    _KEEP.append(ckpt)  # the view holds its root weakly
    view = ckpt._self_view
    serialize_graph(view)  # the first save of a view lends nothing
    return model, optimizer, view


def test_a_torch_model_and_its_optimizer_replay_the_walk() -> None:
    model, optimizer, view = _torch_view()
    first = serialize_graph(view)
    assert view.save_replay is not None  # slots no longer switch the replay off
    with torch.no_grad():
        model[0].weight.add_(1.0)  # in place: the structure is unchanged
    optimizer.step()  # updates the state tensors in place
    second = serialize_graph(view)
    assert second.object_graph_bytes is first.object_graph_bytes  # replayed, not rebuilt
    assert_same(second, fresh(view))
    key = next(k for k in values_of(second) if "OPTIMIZER_SLOT" in k and "exp_avg_sq" in k)
    assert np.array_equal(values_of(second)[key], values_of(fresh(view))[key])


def _state_replaced(model: Any, optimizer: Any) -> None:
    param = model[0].weight
    optimizer.state[param]["exp_avg"] = torch.zeros_like(param)  # a new tensor, same name


def _state_entry_added(model: Any, optimizer: Any) -> None:
    param = model[0].weight
    optimizer.state[param]["extra"] = torch.ones_like(param)  # a new slot name


def _state_dropped(model: Any, optimizer: Any) -> None:
    del optimizer.state[model[1].bias]


def _loaded(model: Any, optimizer: Any) -> None:
    optimizer.load_state_dict(optimizer.state_dict())  # every state tensor replaced
    with torch.no_grad():
        for state in optimizer.state.values():
            state["exp_avg"].add_(5.0)  # only the new tensors hold these values


@pytest.mark.parametrize("change", [_state_replaced, _state_entry_added, _state_dropped, _loaded])
def test_a_changed_optimizer_state_is_walked_again(change: Callable[[Any, Any], None]) -> None:
    model, optimizer, view = _torch_view()
    before = serialize_graph(view)
    change(model, optimizer)
    after = serialize_graph(view)
    assert_same(after, fresh(view))
    if change in (_state_entry_added, _state_dropped):
        assert after.object_graph_bytes != before.object_graph_bytes
    assert serialize_graph(view).object_graph_bytes == after.object_graph_bytes


def test_the_first_step_adds_slots_and_is_walked_again() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    view = ckpt._self_view
    serialize_graph(view)
    before = serialize_graph(view)  # no state yet: no slots
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    after = serialize_graph(view)
    assert any("OPTIMIZER_SLOT" in key for key in values_of(after))
    assert not any("OPTIMIZER_SLOT" in key for key in values_of(before))
    assert_same(after, fresh(view))


def test_a_parameter_group_the_root_does_not_reach_fails_a_replayed_save() -> None:
    model, optimizer, view = _torch_view()
    serialize_graph(view)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(InvalidArgumentError, match="not reachable"):
        serialize_graph(view)


def test_a_numpy_slot_added_later_is_walked_again() -> None:
    root = AutoTrackable()
    root.a, root.b = Variable([1.0, 2.0]), Variable([3.0])
    root.opt = Opt()
    root.opt.add_slot(root.a, "m")
    view = ObjectGraphView(root)
    serialize_graph(view)
    first = serialize_graph(view)
    again = serialize_graph(view)
    assert again.object_graph_bytes is first.object_graph_bytes
    root.opt.add_slot(root.b, "m")  # same slot name, another variable
    after = serialize_graph(view)
    assert_same(after, fresh(view))
    assert len(after.object_graph_proto.nodes) == len(first.object_graph_proto.nodes) + 1
