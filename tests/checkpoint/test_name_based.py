"""Name-based (TF1 ``Saver``) checkpoints restored into objects: ``NameBasedSaverStatus``.

The checkpoint is written by real ``tf.compat.v1.train.Saver`` in graph mode (a plain
variable, a string variable, a partitioned variable and ``global_step``); trackpoint matches
its values to ``tp.Variable`` names, torch ``state_dict`` paths and ``name_map`` keys.
"""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.checkpoint.load_status import NameBasedSaverStatus
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable, PythonState, Variable

pytestmark = pytest.mark.interop

WEIGHT = np.arange(6, dtype=np.float32).reshape(2, 3)
BIAS = np.array([0.5, -0.5], dtype=np.float32)
EMB = np.arange(12, dtype=np.float32).reshape(6, 2)
NAMES = np.array([b"", b"a\x00", b"\x00\xff" * 40000], dtype=object)


@pytest.fixture(scope="module")
def tf1_prefix(tf, tmp_path_factory) -> str:
    """A checkpoint written by tf.compat.v1.train.Saver in a graph and session (no objects)."""
    v1 = tf.compat.v1
    prefix = str(tmp_path_factory.mktemp("tf1") / "model")
    with tf.Graph().as_default():
        v1.get_variable("dense/weight", initializer=WEIGHT)
        v1.get_variable("dense/bias", initializer=BIAS)
        v1.Variable(NAMES, name="names")
        emb = v1.get_variable("emb", shape=EMB.shape, initializer=v1.zeros_initializer(),
                              partitioner=v1.fixed_size_partitioner(2))  # fmt: skip
        v1.train.get_or_create_global_step()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run([part.assign(EMB[3 * i : 3 * i + 3]) for i, part in enumerate(emb)])
            return str(v1.train.Saver().save(session, prefix))


def _model() -> AutoTrackable:
    model = AutoTrackable()
    model.weight = Variable(np.zeros((2, 3), np.float32), name="dense/weight")
    model.names = Variable(np.full(3, b"", dtype=object), name="names")
    model.emb = Variable(np.zeros((6, 2), np.float32), name="emb")
    return model


def test_tf1_saver_checkpoint_restores_variables_by_name(tf1_prefix) -> None:
    model = _model()
    weight = model.weight.array
    status = tp.Checkpoint(model=model).restore(tf1_prefix)
    assert isinstance(status, NameBasedSaverStatus)
    assert model.weight.array is weight and np.array_equal(weight, WEIGHT)  # in place
    assert model.names.numpy().tolist() == NAMES.tolist()  # every byte of a string value
    assert np.array_equal(model.emb.numpy(), EMB)  # reassembled from its two slices
    # Unused checkpoint keys (dense/bias, global_step) and save_counter are fine.
    status.assert_consumed().assert_existing_objects_matched().assert_nontrivial_match()


def test_tf1_into_torch_module_by_state_dict_path(tf1_prefix) -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = torch.nn.Linear(3, 2)  # state_dict: dense.weight, dense.bias

    net = Net()
    weight = net.dense.weight
    status = tp.Checkpoint(model=net).read(tf1_prefix)
    assert net.dense.weight is weight and weight.requires_grad
    assert np.array_equal(weight.detach().numpy(), WEIGHT)
    assert np.array_equal(net.dense.bias.detach().numpy(), BIAS)
    status.assert_consumed()


def test_b1_variables_attached_later_get_their_value(tf1_prefix) -> None:
    root = AutoTrackable()
    status = tp.Checkpoint(root=root).read(tf1_prefix)
    root.late = Variable(np.zeros((2, 3), np.float32), name="dense/weight")
    assert np.array_equal(root.late.numpy(), WEIGHT)
    subtree = AutoTrackable()  # built first, attached whole
    subtree.bias = Variable(np.zeros(2, np.float32), name="dense/bias")
    root.sub = subtree
    root.sub.items = [Variable(np.zeros((6, 2), np.float32), name="emb")]
    root.sub.names = Variable(np.full(3, b"", dtype=object), name="names")
    assert np.array_equal(subtree.bias.numpy(), BIAS)
    assert np.array_equal(root.sub.items[0].numpy(), EMB)
    assert root.sub.names.numpy().tolist() == NAMES.tolist()
    status.assert_consumed()
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        root.wrong = Variable(np.zeros(3, np.float32), name="dense/bias")


def test_c1_objects_without_a_value_fail_every_assertion(tf1_prefix, caplog) -> None:
    model = _model()
    model.missing = Variable(np.zeros(2), name="not/in/checkpoint")
    model.unnamed = Variable(np.zeros(2))  # no name: nothing to match
    model.state = np.zeros(2)  # a tracked array has no name either
    status = tp.Checkpoint(model=model).restore(tf1_prefix)
    assert np.array_equal(model.weight.numpy(), WEIGHT)  # the named ones are restored
    for assertion in ("assert_consumed", "assert_existing_objects_matched",
                      "assert_nontrivial_match"):  # fmt: skip
        with pytest.raises(AssertionError, match="3 objects found no value") as raised:
            getattr(status, assertion)()
    message = str(raised.value)
    del raised  # its traceback holds the status
    assert "(root).model.missing" in message and "no key 'not/in/checkpoint'" in message
    assert "no TF1 name for its value 'model/unnamed/.ATTRIBUTES/VARIABLE_VALUE'" in message
    assert "(root).model.state" in message
    # Dropped without expect_partial(): one warning naming what was left out (C4).
    with caplog.at_level(logging.WARNING, logger="trackpoint.checkpoint"):
        del status, model
        gc.collect()
    warnings = [r.getMessage() for r in caplog.records if "(root).model.missing" in r.getMessage()]
    assert len(warnings) == 1 and "name-based" in warnings[0]
    assert "Value in checkpoint was not used: global_step" in warnings[0]


def test_c4_expect_partial_silences_the_warning(tf1_prefix, caplog) -> None:
    gc.collect()  # restores of earlier tests log their own warnings
    model = AutoTrackable()
    model.other = Variable(np.zeros(2), name="other")
    with caplog.at_level(logging.WARNING, logger="trackpoint.checkpoint"):
        tp.Checkpoint(model=model).read(tf1_prefix).expect_partial()
        del model
        gc.collect()
    assert not [r for r in caplog.records if "(root).model.other" in r.getMessage()]


def test_b8_mismatch_fails_the_whole_restore(tf1_prefix) -> None:
    model = _model()
    model.bias = Variable(np.full(3, 7.0, np.float32), name="dense/bias")  # saved shape (2,)
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        tp.Checkpoint(model=model).read(tf1_prefix)
    assert not model.weight.numpy().any() and model.names.numpy().tolist() == [b""] * 3
    doubles = Variable(np.zeros((2, 3), np.float64), name="dense/weight")  # saved float32
    with pytest.raises(InvalidArgumentError, match="dtype float32"):
        tp.Checkpoint(model=doubles).read(tf1_prefix)
    assert not doubles.numpy().any()


def test_name_map_names_anything_else(tf1_prefix) -> None:
    class Pair(PythonState):  # a value no TF1 checkpoint names by default
        def serialize(self) -> bytes:
            return b""

        def deserialize(self, data: bytes) -> None:
            raise AssertionError("not restored")

    model = AutoTrackable()
    model.kernel = np.zeros((2, 3), np.float32)
    model.table = {"bias": np.zeros(2, np.float32)}
    model.extra = Pair()
    mapping = {"model/kernel/.ATTRIBUTES/VARIABLE_VALUE": "dense/weight"}
    options = tp.CheckpointOptions(name_map=mapping)
    status = tp.Checkpoint(model=model).read(tf1_prefix, options)
    assert np.array_equal(model.kernel, WEIGHT) and not model.table["bias"].any()
    with pytest.raises(AssertionError, match="2 objects found no value"):
        status.assert_consumed()

    # A function: object-based key -> TF1 key, None where it has none.
    def by_leaf(key: str) -> str | None:
        return "dense/bias" if key.startswith("model/table/bias/") else None

    options = tp.CheckpointOptions(name_map=by_leaf)
    tp.Checkpoint(model=model).read(tf1_prefix, options).expect_partial()
    assert np.array_equal(model.table["bias"], BIAS)
    with pytest.raises(InvalidArgumentError, match="name_map must be a mapping or a function"):
        tp.CheckpointOptions(name_map=3)  # type: ignore[arg-type]
