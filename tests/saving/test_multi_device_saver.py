"""MultiDeviceSaver: round trip, lazy values (G2), tasks (H5), custom policies (H3), threads."""

from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.graph.keys import local_name
from trackpoint.graph.serialize import TensorsByTrackable
from trackpoint.saving import (
    CheckpointOptions,
    DeviceValue,
    MaxShardSizePolicy,
    MultiDeviceSaver,
    ShardingPolicy,
    shard_writer,
    task_of,
)

KEY = "model/w/.ATTRIBUTES/VARIABLE_VALUE"


def data_files(prefix: str) -> list[str]:
    directory, base = os.path.split(prefix)
    return sorted(n for n in os.listdir(directory) if n.startswith(f"{base}.data-"))


def test_round_trip_many_dtypes_and_local_names(prefix, make_holder) -> None:  # noqa: ANN001
    values = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f64": np.float64(3.5),
        "i8": np.array([-1, 2], np.int8),
        "u64": np.array([2**63], np.uint64),
        "bool": np.array([True, False]),
        "c64": np.array([1 + 2j], np.complex64),
        "bf16": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
        "str": np.array([b"", b"a\x00b", b"xyz"], dtype=object),
        "fortran": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    }
    holder = make_holder("h")
    saver = MultiDeviceSaver(
        {holder: {f"obj/.ATTRIBUTES/{name}": value for name, value in values.items()}}
    )
    assert saver.save(prefix) == prefix
    assert data_files(prefix) == ["ckpt.data-00000-of-00001"]
    saver.restore(prefix)
    assert len(holder.calls) == 1
    restored = holder.calls[0]
    assert set(restored) == set(values)
    for name, value in values.items():
        assert restored[name].dtype == value.dtype, name
        np.testing.assert_array_equal(restored[name], value)


def test_restore_hands_read_only_views_valid_during_the_call(prefix) -> None:  # noqa: ANN001
    seen = {}

    class Peek:
        def _restore_from_tensors(self, tensors):  # noqa: ANN001, ANN202
            seen["writeable"] = tensors["VARIABLE_VALUE"].flags.writeable
            seen["sum"] = float(tensors["VARIABLE_VALUE"].sum())

    saver = MultiDeviceSaver({Peek(): {KEY: np.ones(1000, np.float32)}})
    saver.save(prefix)
    saver.restore(prefix)
    assert seen == {"writeable": False, "sum": 1000.0}


def test_local_name_takes_the_part_after_attributes() -> None:
    assert local_name("a/b/.ATTRIBUTES/VARIABLE_VALUE") == "VARIABLE_VALUE"
    assert local_name("/.ATTRIBUTES/v1") == "v1"
    assert local_name("..ATTRIBUTES/.ATTRIBUTES/x") == "x"  # escaped child named .ATTRIBUTES
    assert local_name("global_step") == "global_step"


def test_g2_callable_is_evaluated_exactly_once_per_save(prefix, make_holder) -> None:  # noqa: ANN001
    state = {"value": np.array([1.0, 2.0]), "calls": 0}

    def read_value() -> np.ndarray:
        state["calls"] += 1
        return state["value"].copy()

    holder = make_holder("lazy")
    saver = MultiDeviceSaver({holder: {KEY: read_value}})
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(8)))
    assert state["calls"] == 1
    state["value"] = np.array([7.0, 8.0])  # a later state must not leak into the file
    saver.restore(prefix)
    assert state["calls"] == 1  # restore never evaluates values
    np.testing.assert_array_equal(holder.calls[0]["VARIABLE_VALUE"], [1.0, 2.0])
    saver.save(prefix)
    assert state["calls"] == 2


def test_none_values_are_not_written(prefix) -> None:  # noqa: ANN001
    saver = MultiDeviceSaver({None: {"kept": np.ones(2), "graph_only": None}})
    saver.save(prefix)
    with BundleReader(prefix) as reader:
        assert reader.keys() == ["kept"]


def test_duplicate_key_and_slice_names_both_owners(make_holder) -> None:  # noqa: ANN001
    a, b = make_holder("first"), make_holder("second")
    with pytest.raises(InvalidArgumentError, match=r"'k'.*Holder\('first'\).*Holder\('second'\)"):
        MultiDeviceSaver({a: {"k": np.ones(1)}, b: {"k": {"": np.ones(1)}}})
    # The same key under different slice specs is fine (two partitions of one tensor).
    MultiDeviceSaver({a: {"k": {"4 0,2": np.ones(2)}}, b: {"k": {"4 2,2": np.ones(2)}}})


def test_malformed_slice_spec_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="slice spec '4 6 zero' of checkpoint key 'k'"):
        MultiDeviceSaver({None: {"k": {"4 6 zero": np.ones(1)}}})


def test_partitions_restore_as_sub_boxes(prefix, make_holder) -> None:  # noqa: ANN001
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    top, bottom = make_holder("top"), make_holder("bottom")
    saver = MultiDeviceSaver(
        {
            top: {KEY: {"4 6 0,2:0,6": full[:2]}},
            bottom: {KEY: {"4 6 2,2:0,6": full[2:]}},
        }
    )
    saver.save(prefix)
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read(KEY), full)
    # A reader asking for other boxes gets exactly those (read_slice).
    left, right = make_holder("left"), make_holder("right")
    MultiDeviceSaver(
        {left: {KEY: {"4 6 0,4:0,3": None}}, right: {KEY: {"4 6 0,4:3,3": None}}}
    ).restore(prefix)
    np.testing.assert_array_equal(left.calls[0]["VARIABLE_VALUE"]["4 6 0,4:0,3"], full[:, :3])
    np.testing.assert_array_equal(right.calls[0]["VARIABLE_VALUE"]["4 6 0,4:3,3"], full[:, 3:])
    wrong = MultiDeviceSaver({make_holder("x"): {KEY: {"5 6 0,1:0,6": None}}})
    with pytest.raises(InvalidArgumentError, match="shape"):
        wrong.restore(prefix)


def test_trackable_is_called_once_all_of_its_keys_arrived(prefix, make_holder) -> None:  # noqa: ANN001
    holder = make_holder("multi")
    tensors = {
        "a/.ATTRIBUTES/x": DeviceValue(np.ones(1), "/job:w/task:0/device:CPU:0"),
        "a/.ATTRIBUTES/y": DeviceValue(np.zeros(1), "/job:w/task:1/device:GPU:0"),
    }
    saver = MultiDeviceSaver({holder: tensors})
    saver.save(prefix)
    saver.restore(prefix)
    assert len(holder.calls) == 1 and set(holder.calls[0]) == {"x", "y"}


def test_missing_key_on_restore_raises_not_found(prefix, make_holder) -> None:  # noqa: ANN001
    MultiDeviceSaver({None: {"a": np.ones(1)}}).save(prefix)
    with pytest.raises(NotFoundError):
        MultiDeviceSaver({make_holder("b"): {"b": np.ones(1)}}).restore(prefix)
    with pytest.raises(NotFoundError):
        MultiDeviceSaver({make_holder("b"): {"a": np.ones(1)}}).restore(prefix + "-missing")


# -- tasks (H5) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "task"),
    [
        (None, ""),
        ("cpu", ""),
        ("cuda:1", ""),
        ("/device:GPU:0", ""),
        ("/job:localhost/replica:0/task:0/device:CPU:0", ""),
        ("/job:worker/task:1/device:GPU:0", "/job:worker/task:1"),
        ("/job:worker/replica:0/task:2/cpu:0", "/job:worker/replica:0/task:2"),
        ("/job:ps", "/job:ps/task:0"),
    ],
)
def test_task_of(device, task) -> None:  # noqa: ANN001
    assert task_of(device) == task


def test_h5_one_data_file_per_task_merged_into_one_prefix(prefix, make_holder) -> None:  # noqa: ANN001
    holders = [make_holder(f"h{i}") for i in range(5)]
    devices = [
        "/job:worker/task:0/device:GPU:0",
        "/job:worker/task:1/device:GPU:0",
        "/job:worker/task:0/device:GPU:1",  # same task as the first: same data file
        "cpu",
        "cuda:0",  # local devices collapse to one task
    ]
    values = [np.full(3, i, np.float32) for i in range(5)]
    saver = MultiDeviceSaver(
        {
            h: {f"v{i}/.ATTRIBUTES/VARIABLE_VALUE": DeviceValue(v, d)}
            for i, (h, v, d) in enumerate(zip(holders, values, devices))
        }
    )
    assert saver.tasks == ["/job:worker/task:0", "/job:worker/task:1", ""]
    saver.save(prefix)
    assert data_files(prefix) == [f"ckpt.data-0000{i}-of-00003" for i in range(3)]
    with BundleReader(prefix) as reader:
        shard_of = {k: reader.entry(k).shard_id for k in reader.keys()}
    assert shard_of == {
        "v0/.ATTRIBUTES/VARIABLE_VALUE": 0,
        "v2/.ATTRIBUTES/VARIABLE_VALUE": 0,
        "v1/.ATTRIBUTES/VARIABLE_VALUE": 1,
        "v3/.ATTRIBUTES/VARIABLE_VALUE": 2,
        "v4/.ATTRIBUTES/VARIABLE_VALUE": 2,
    }
    saver.restore(prefix)
    for holder, value in zip(holders, values):
        np.testing.assert_array_equal(holder.calls[0]["VARIABLE_VALUE"], value)


def test_h5_shards_are_numbered_across_tasks(prefix) -> None:  # noqa: ANN001
    saver = MultiDeviceSaver(
        {
            None: {
                "a": DeviceValue(np.ones(4, np.float32), "/job:w/task:0"),
                "b": DeviceValue(np.ones(4, np.float32), "/job:w/task:1"),
            }
        }
    )
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(8)))
    assert len(data_files(prefix)) == 4
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read("a"), np.ones(4))
        assert [str(s) for s in reader.slices("b")] == ["0,2", "2,2"]


# -- concurrency -------------------------------------------------------------------------------


def test_shards_are_written_concurrently(prefix, monkeypatch) -> None:  # noqa: ANN001
    # Each shard writer waits until another one is running at the same time; sequential
    # writing would break the barrier (the timeout only bounds a failing run).
    barrier = threading.Barrier(2, timeout=30)
    original = shard_writer.write_shard

    def rendezvous(*args):  # noqa: ANN002, ANN202
        barrier.wait()
        return original(*args)

    monkeypatch.setattr(shard_writer, "write_shard", rendezvous)
    saver = MultiDeviceSaver({None: {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}})
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(16)))
    assert len(data_files(prefix)) == 2


def test_pool_size_defaults_to_min_4_shards_and_follows_option(prefix, monkeypatch) -> None:  # noqa: ANN001
    sizes = []
    real = shard_writer.ThreadPoolExecutor

    def recording(max_workers, **kwargs):  # noqa: ANN001, ANN003, ANN202
        sizes.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(shard_writer, "ThreadPoolExecutor", recording)
    saver = MultiDeviceSaver({None: {f"k{i}": np.ones(1, np.float32) for i in range(6)}})
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(4)))
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(8)))
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(4), num_io_threads=2))
    assert sizes == [4, 3, 2]


def test_progress_events_and_write_callbacks_run_after_commit(prefix) -> None:  # noqa: ANN001
    events, calls = [], []
    options = CheckpointOptions(
        sharding_policy=MaxShardSizePolicy(8),
        progress=events.append,
        write_callbacks=[
            lambda p: calls.append((p, os.path.exists(p + ".index"))),
            lambda: calls.append("no-arg"),
        ],
    )
    MultiDeviceSaver({None: {"a": np.ones(4, np.float32)}}).save(prefix, options)
    assert calls == [(prefix, True), "no-arg"]
    assert [e.phase for e in events] == ["write", "write", "commit"]
    assert events[-1].bytes_done == events[-1].bytes_total == 16
    assert events[-1].num_shards == 2


# -- custom sharding policies (H3) -----------------------------------------------------------


class Callback(ShardingPolicy):
    """A custom policy that applies ``mutate`` to the one shard ShardByTaskPolicy would give."""

    def __init__(self, mutate) -> None:  # noqa: ANN001
        self.mutate = mutate

    @property
    def description(self) -> str:
        return "test callback"

    def __call__(self, shardable_tensors):  # noqa: ANN001, ANN204
        shard = {}
        for st in shardable_tensors:
            shard.setdefault(st.checkpoint_key, {})[st.slice_spec] = st.tensor
        return self.mutate(shard, shardable_tensors)


def _two_task_saver() -> MultiDeviceSaver:
    return MultiDeviceSaver(
        {
            None: {
                "a": DeviceValue(np.ones((2, 2), np.float32), "/job:w/task:0"),
                "b": DeviceValue(np.zeros(3, np.int32), "/job:w/task:0"),
                "c": DeviceValue(np.ones(1, np.float32), "/job:w/task:1"),
            }
        }
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s, t: [s, s], "several tensors have checkpoint key 'a'"),
        (lambda s, t: [{**s, "new": {"": np.ones(1)}}], "not in the object graph.*'new'"),
        (
            lambda s, t: [{k: v for k, v in s.items() if k != "b"}] if "b" in s else [s],
            "missing from the shards: checkpoint key 'b'",
        ),
        (
            lambda s, t: [{**s, "a": {"": np.ones((4,), np.float32)}}] if "a" in s else [s],
            "'a'.*changed shape from \\[2, 2\\] to \\[4\\]",
        ),
        (
            lambda s, t: [{**s, "b": {"": np.zeros(3, np.int64)}}] if "b" in s else [s],
            "'b'.*changed dtype from int32 to int64",
        ),
        (
            lambda s, t: [{**s, "c": {"": np.ones(1, np.float32)}}] if "a" in s else [{}],
            "'c', slice spec '' of task '/job:w/task:1' was placed in a shard of task "
            "'/job:w/task:0'",
        ),
        (
            lambda s, t: (
                [{**s, "a": {"": DeviceValue(s["a"][""], "/job:w/task:3")}}] if "a" in s else [s]
            ),
            "'a'.*moved from task '/job:w/task:0' to task '/job:w/task:3'",
        ),
    ],
    ids=["duplicate", "added", "removed", "shape", "dtype", "moved-task", "device-changed"],
)
def test_h3_custom_policy_validation(prefix, mutate, message) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match=message) as info:
        _two_task_saver().save(prefix, CheckpointOptions(sharding_policy=Callback(mutate)))
    assert "test callback" in str(info.value)
    assert not os.path.exists(prefix + ".index")
    assert os.listdir(os.path.dirname(prefix)) == []


def test_h3_valid_custom_policy_and_plain_function(prefix) -> None:  # noqa: ANN001
    def one_file_per_key(shardable_tensors):  # noqa: ANN001, ANN202
        return [{st.checkpoint_key: {st.slice_spec: st.tensor}} for st in shardable_tensors]

    _two_task_saver().save(prefix, CheckpointOptions(sharding_policy=Callback(lambda s, t: [s])))
    assert len(data_files(prefix)) == 2
    _two_task_saver().save(prefix, CheckpointOptions(sharding_policy=one_file_per_key))
    assert len(data_files(prefix)) == 3
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read("a"), np.ones((2, 2)))


def test_h4_pre_sliced_partitions_resharded_restore_exactly(prefix, make_holder) -> None:  # noqa: ANN001
    full = np.arange(50, dtype=np.float32).reshape(5, 10)
    left, right = make_holder("left"), make_holder("right")
    saver = MultiDeviceSaver(
        {
            left: {KEY: {"5 10 0,5:0,4": full[:, :4]}},
            right: {KEY: {"5 10 0,5:4,6": full[:, 4:]}},
        }
    )
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(40)))
    assert len(data_files(prefix)) > 4
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read(KEY), full)
        # Every stored slice lies inside one partition: offsets are in the full shape.
        for tensor_slice in reader.slices(KEY):
            (r0, r1), (c0, c1) = tensor_slice.bounds((5, 10))
            assert c1 <= 4 or c0 >= 4
    saver.restore(prefix)
    np.testing.assert_array_equal(left.calls[0]["VARIABLE_VALUE"]["5 10 0,5:0,4"], full[:, :4])
    np.testing.assert_array_equal(right.calls[0]["VARIABLE_VALUE"]["5 10 0,5:4,6"], full[:, 4:])


def test_h2_string_round_trip_through_sharded_save(prefix, make_holder) -> None:  # noqa: ANN001
    strings = np.array([b"0123456789", b"", "ключ".encode(), b"\x00\xff" * 5], dtype=object)
    holder = make_holder("s")
    saver = MultiDeviceSaver({holder: {KEY: strings}})
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(10)))
    assert len(data_files(prefix)) == 4
    saver.restore(prefix)
    assert holder.calls[0]["VARIABLE_VALUE"].tolist() == strings.tolist()


def test_saver_without_values_writes_an_empty_checkpoint(prefix) -> None:  # noqa: ANN001
    MultiDeviceSaver({}).save(prefix)
    with BundleReader(prefix) as reader:
        assert reader.keys() == []


def _pairs(serialized: dict) -> TensorsByTrackable:  # noqa: ANN001
    """The graph walk's container (a list of pairs), as a save hands it over."""
    return TensorsByTrackable(list(serialized.items()))


def test_pairs_are_refused_as_a_dict_is(make_holder) -> None:  # noqa: ANN001
    a, b = make_holder("first"), make_holder("second")
    with pytest.raises(InvalidArgumentError, match=r"'k'.*Holder\('first'\).*Holder\('second'\)"):
        MultiDeviceSaver(_pairs({a: {"k": np.ones(1)}, b: {"j": np.ones(1), "k": np.ones(1)}}))
    with pytest.raises(InvalidArgumentError, match="non-empty str"):
        MultiDeviceSaver(_pairs({a: {"": np.ones(1)}}))
    with pytest.raises(InvalidArgumentError, match="non-empty str"):
        MultiDeviceSaver(_pairs({a: {3: np.ones(1)}}))


def test_pairs_dicts_and_mixed_values_write_the_same_files(tmp_path, make_holder) -> None:  # noqa: ANN001
    holders = [make_holder(f"h{i}") for i in range(50)]
    values = {h: {f"h{i}/a": np.full(3, i, np.float32), f"h{i}/b": np.arange(i)}
              for i, h in enumerate(holders)}  # fmt: skip
    mixed = dict(values)
    mixed[holders[7]] = {"h7/a": lambda: np.full(3, 7, np.float32), "h7/b": np.arange(7)}
    paths = []
    for name, serialized in (("plain", _pairs(values)), ("dict", values), ("mixed", _pairs(mixed))):
        paths.append(str(tmp_path / name))
        MultiDeviceSaver(serialized).save(paths[-1])
    data = [open(p + ".data-00000-of-00001", "rb").read() for p in paths]
    index = [open(p + ".index", "rb").read() for p in paths]
    assert data[0] == data[1] == data[2] and index[0] == index[1] == index[2]
    MultiDeviceSaver(_pairs(values)).restore(paths[0])
    assert holders[9].calls[-1][local_name("h9/b")].tolist() == list(range(9))


def test_one_entry_form_keeps_data_order_specs_devices_and_tasks(make_holder) -> None:  # noqa: ANN001
    """Whole arrays, a callable, None, slices and device values in one list of pairs: the
    snapshot lists each task's values in data order, tasks in first-seen order."""
    a, b = make_holder("a"), make_holder("b")
    remote = "/job:worker/replica:0/task:1/device:CPU:0"
    saver = MultiDeviceSaver(_pairs({
        a: {"a/w": np.ones(2), "a/none": None, "a/f": lambda: np.full(1, 5.0),
            "a/r": DeviceValue(np.zeros(1), remote)},
        b: {"b/p": {"4 0,2": np.ones(2), "4 2,2": np.zeros(2)}, "b/w": np.arange(3),
            "b/d": DeviceValue(np.ones(3), "/device:CPU:0")},
    }))  # fmt: skip
    assert saver.tasks == ["", "/job:worker/replica:0/task:1"]
    snapshot = saver.snapshot().tensors_by_task
    local = [(t.checkpoint_key, t.slice_spec, t.device, t.trackable) for t in snapshot[""]]
    assert local == [
        ("a/w", "", None, a), ("a/f", "", None, a), ("b/p", "4 0,2", None, b),
        ("b/p", "4 2,2", None, b), ("b/w", "", None, b), ("b/d", "", "/device:CPU:0", b),
    ]
    assert snapshot[""][1].tensor.tolist() == [5.0]
    assert [(t.checkpoint_key, t.device) for t in snapshot["/job:worker/replica:0/task:1"]] == [
        ("a/r", remote)
    ]
    with pytest.raises(InvalidArgumentError, match=r"'b/p' with slice spec '4 0,2'.*twice"):
        MultiDeviceSaver(_pairs({a: {"b/p": {"4 0,2": np.ones(2)}},
                                 b: {"b/p": {"4 0,2": np.ones(2)}}}))  # fmt: skip


def test_a_shard_of_every_kind_of_value_round_trips(tmp_path) -> None:  # noqa: ANN001
    """The one shard writer: runs of numeric arrays, strings, slices, device values and
    ndarray subclasses in their places; the payload is what ``payload_bytes`` says."""
    from trackpoint.storage import storage_for

    shard = {
        "n1": {"": np.arange(3.0)}, "s": {"": np.array([b"ab", b"c"], dtype=object)},
        "n2": {"": np.ones((2, 2), np.int32)}, "sl": {"4 0,2": np.ones(2), "4 2,2": np.zeros(2)},
        "dv": {"": DeviceValue(np.full(2, 7.0), "/device:CPU:0")},
        "m": {"": np.ma.masked_array([1.0, 2.0])}, "n3": {"": np.zeros(0)},
    }  # fmt: skip
    prefix = str(tmp_path / "shard")
    payload = shard_writer.write_shard(prefix, shard, storage_for(prefix))
    assert payload == shard_writer.payload_bytes(shard) == 24 + 3 + 16 + 32 + 16 + 16
    with BundleReader(prefix) as reader:
        assert reader.read("n1").tolist() == [0.0, 1.0, 2.0]
        assert reader.read("s").tolist() == [b"ab", b"c"]
        assert reader.read("sl").tolist() == [1.0, 1.0, 0.0, 0.0]
        assert reader.read("dv").tolist() == [7.0, 7.0]
        assert reader.read("m").tolist() == [1.0, 2.0]
        assert reader.read("n3").shape == (0,)
