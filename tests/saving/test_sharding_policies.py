"""Sharding policies: TF's MaxShardSizePolicy layouts (§13), the two fixed bugs, H1–H4."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from trackpoint.errors import InvalidArgumentError
from trackpoint.saving import MaxShardSizePolicy, ShardByTaskPolicy, ShardingPolicy
from trackpoint.saving.sharding import OBJECT_GRAPH_KEY

GRAPH = np.array(b"\x0a\x00graph", dtype=object)


def layout(shards):  # noqa: ANN001, ANN201
    """[{key: [specs...]}] for comparing shard sets."""
    return [{key: list(slices) for key, slices in shard.items()} for shard in shards]


def payload(shard) -> int:  # noqa: ANN001
    total = 0
    for slices in shard.values():
        for value in slices.values():
            if value.dtype.kind in "OSU":
                total += sum(len(x) for x in value.reshape(-1).tolist())
            else:
                total += value.nbytes
    return total


def test_trace_a_exact_specs_and_shards(make_st) -> None:  # noqa: ANN001
    v = np.arange(24, dtype=np.float32).reshape(4, 6)
    tensors = [
        make_st("s", np.arange(5, dtype=np.int64)),
        make_st("v", v),
        make_st("save_counter", np.int64(1)),
        make_st(OBJECT_GRAPH_KEY, GRAPH),
    ]
    shards = MaxShardSizePolicy(40)(tensors)
    assert layout(shards) == [
        {"s": ["5 0,5"]},
        {"v": ["4 6 0,4:0,2"]},
        {"v": ["4 6 0,2:2,4", "4 6 2,2:2,1"]},
        {"v": ["4 6 2,2:3,3"], "save_counter": [""], OBJECT_GRAPH_KEY: [""]},
    ]
    np.testing.assert_array_equal(shards[1]["v"]["4 6 0,4:0,2"], v[0:4, 0:2])
    np.testing.assert_array_equal(shards[2]["v"]["4 6 0,2:2,4"], v[0:2, 2:6])
    np.testing.assert_array_equal(shards[2]["v"]["4 6 2,2:2,1"], v[2:4, 2:3])
    np.testing.assert_array_equal(shards[3]["v"]["4 6 2,2:3,3"], v[2:4, 3:6])


def test_trace_b_strings_are_sliced_by_longest_element(make_st) -> None:  # noqa: ANN001
    strings = np.array([b"abc", b"defgh", b"ij"], dtype=object)
    shards = MaxShardSizePolicy(16)(
        [make_st("big", np.arange(10, dtype=np.float32)), make_st("s", strings)]
    )
    assert layout(shards) == [
        {"big": ["10 0,4"]},
        {"big": ["10 4,3", "10 7,1"]},
        {"big": ["10 8,2"], "s": ["3 0,1"]},
        {"s": ["3 1,2"]},
    ]
    assert shards[3]["s"]["3 1,2"].tolist() == [b"defgh", b"ij"]


# TF's sharding_policies_test examples (semantics H1): v0 float32[4], v1 int32[4,1].
@pytest.mark.parametrize(
    ("max_bytes", "expected"),
    [
        (4, [{"v0": ["4 0,1"]}, {"v0": ["4 1,1"]}, {"v0": ["4 2,1"]}, {"v0": ["4 3,1"]},
             {"v1": ["4 1 0,1:0,1"]}, {"v1": ["4 1 1,1:0,1"]}, {"v1": ["4 1 2,1:0,1"]},
             {"v1": ["4 1 3,1:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (8, [{"v0": ["4 0,2"]}, {"v0": ["4 2,2"]},
             {"v1": ["4 1 0,2:0,1"]}, {"v1": ["4 1 2,2:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (10, [{"v0": ["4 0,2"]}, {"v0": ["4 2,2"]},
              {"v1": ["4 1 0,2:0,1"]}, {"v1": ["4 1 2,2:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (16, [{"v0": ["4 0,4"]}, {"v1": ["4 1 0,4:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (18, [{"v0": ["4 0,4"]}, {"v1": ["4 1 0,4:0,1"], OBJECT_GRAPH_KEY: [""]}]),
    ],
)
def test_h1_one_dimensional_examples(make_st, max_bytes, expected) -> None:  # noqa: ANN001
    tensors = [
        make_st("v0", np.array([0.0, 1.0, 2.0, 3.0], np.float32)),
        make_st("v1", np.array([[4], [5], [6], [7]], np.int32)),
        make_st(OBJECT_GRAPH_KEY, GRAPH),
    ]
    shards = MaxShardSizePolicy(max_bytes)(tensors)
    assert layout(shards) == expected
    for shard in shards:
        assert payload({k: v for k, v in shard.items() if k != OBJECT_GRAPH_KEY}) <= max_bytes


@pytest.mark.parametrize(
    ("max_bytes", "expected"),
    [
        (8, [{"v0": ["3 2 0,1:0,2"]}, {"v0": ["3 2 1,1:0,2"]}, {"v0": ["3 2 2,1:0,2"]},
             {"v1": ["3 2 1 0,1:0,2:0,1"]}, {"v1": ["3 2 1 1,1:0,2:0,1"]},
             {"v1": ["3 2 1 2,1:0,2:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (10, [{"v0": ["3 2 0,1:0,2"]}, {"v0": ["3 2 1,1:0,2"]}, {"v0": ["3 2 2,1:0,2"]},
              {"v1": ["3 2 1 0,1:0,2:0,1"]}, {"v1": ["3 2 1 1,1:0,2:0,1"]},
              {"v1": ["3 2 1 2,1:0,2:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (12, [{"v0": ["3 2 0,3:0,1"]}, {"v0": ["3 2 0,3:1,1"]},
              {"v1": ["3 2 1 0,3:0,1:0,1"]},
              {"v1": ["3 2 1 0,3:1,1:0,1"], OBJECT_GRAPH_KEY: [""]}]),
        (16, [{"v0": ["3 2 0,2:0,2"]}, {"v0": ["3 2 2,1:0,2"], "v1": ["3 2 1 0,1:0,2:0,1"]},
              {"v1": ["3 2 1 1,2:0,2:0,1"], OBJECT_GRAPH_KEY: [""]}]),
    ],
)
def test_h1_two_dimensional_examples(make_st, max_bytes, expected) -> None:  # noqa: ANN001
    v0 = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
    v1 = np.array([[[6.0], [7.0]], [[8.0], [9.0]], [[10.0], [11.0]]], np.float32)
    shards = MaxShardSizePolicy(max_bytes)(
        [make_st("v0", v0), make_st("v1", v1), make_st(OBJECT_GRAPH_KEY, GRAPH)]
    )
    assert layout(shards) == expected
    if max_bytes == 12:
        np.testing.assert_array_equal(shards[1]["v0"]["3 2 0,3:1,1"], [[1], [3], [5]])


def test_h2_strings_one_per_shard_and_large_scalar_isolated(make_st) -> None:  # noqa: ANN001
    strings = np.array([b"ABCDEFGHIJ", b"0123456789", b"", b"KLMNOPQRST"], dtype=object)
    shards = MaxShardSizePolicy(10)([make_st("v0", strings), make_st(OBJECT_GRAPH_KEY, GRAPH)])
    assert layout(shards) == [
        {"v0": ["4 0,1"]}, {"v0": ["4 1,1"]}, {"v0": ["4 2,1"]},
        {"v0": ["4 3,1"], OBJECT_GRAPH_KEY: [""]},
    ]
    large = MaxShardSizePolicy(8)(
        [make_st("v0", np.array(b"0123456789", dtype=object)), make_st(OBJECT_GRAPH_KEY, GRAPH)]
    )
    assert layout(large) == [{OBJECT_GRAPH_KEY: [""]}, {"v0": [""]}]


def test_strings_kept_whole_with_slice_strings_false(make_st) -> None:  # noqa: ANN001
    # TF 2.21 cannot restore sliced strings; this mode writes files it can read.
    strings = np.array([b"abc", b"defgh", b"ij"], dtype=object)
    tensors = [
        make_st("big", np.arange(10, dtype=np.float32)),
        make_st("s", strings),
        make_st("long", np.array([b"x" * 20], dtype=object)),
    ]
    shards = MaxShardSizePolicy(16, slice_strings=False)(tensors)
    assert layout(shards) == [
        {"big": ["10 0,4"]},
        {"big": ["10 4,3", "10 7,1"]},
        {"big": ["10 8,2"]},
        {"s": [""]},
        {"long": [""]},
    ]


def test_h2_unicode_strings_are_sized_in_utf8_bytes(make_st) -> None:  # noqa: ANN001
    # "ключ" is 8 UTF-8 bytes but 4 characters.
    shards = MaxShardSizePolicy(8)([make_st("s", np.array(["ключ", "ключ"], dtype=object))])
    assert layout(shards) == [{"s": ["2 0,1"]}, {"s": ["2 1,1"]}]


def test_h4_pre_sliced_value_keeps_offsets_in_full_shape(make_st) -> None:  # noqa: ANN001
    part = np.array([[1.0, 2.0, 3.0], [6.0, 7.0, 8.0]], np.float32)  # columns 1..3 of [2, 5]
    tensors = [make_st("sliced", part, spec="2 5 0,2:1,3"), make_st(OBJECT_GRAPH_KEY, GRAPH)]
    shards = MaxShardSizePolicy(8)(tensors)
    assert layout(shards) == [
        {"sliced": ["2 5 0,2:1,1"]},
        {"sliced": ["2 5 0,1:2,2"]},
        {"sliced": ["2 5 1,1:2,2"], OBJECT_GRAPH_KEY: [""]},
    ]
    np.testing.assert_array_equal(shards[0]["sliced"]["2 5 0,2:1,1"], [[1.0], [6.0]])
    np.testing.assert_array_equal(shards[2]["sliced"]["2 5 1,1:2,2"], [[7.0, 8.0]])
    shards = MaxShardSizePolicy(12)(tensors)
    assert layout(shards) == [
        {"sliced": ["2 5 0,1:1,3"]},
        {"sliced": ["2 5 1,1:1,3"], OBJECT_GRAPH_KEY: [""]},
    ]


def test_fixed_bug_zero_element_tensors_are_stored_whole(make_st) -> None:  # noqa: ANN001
    shards = MaxShardSizePolicy(8)(
        [make_st("empty", np.zeros((0, 1618), np.float32)), make_st("e2", np.zeros((16, 0, 18)))]
    )
    assert layout(shards) == [{"empty": [""], "e2": [""]}]
    assert shards[0]["empty"][""].shape == (0, 1618)


def test_fixed_bug_unsliceable_tensor_gets_own_oversized_shard(make_st, caplog) -> None:  # noqa: ANN001
    x = np.arange(9, dtype=np.float32).reshape(3, 3)  # every row/column is 12 B > 8 B
    with caplog.at_level(logging.WARNING, logger="trackpoint.saving.sharding"):
        shards = MaxShardSizePolicy(8)(
            [make_st("a", np.float32(1)), make_st("x", x), make_st("b", np.float32(2))]
        )
    assert layout(shards) == [{"a": [""], "b": [""]}, {"x": [""]}]
    assert shards[1]["x"][""] is x
    assert "Tensor x cannot be sliced" in caplog.text


def test_shard_by_task_policy_puts_everything_in_one_shard(make_st) -> None:  # noqa: ANN001
    tensors = [make_st("a", np.ones(3)), make_st("b", np.ones(2), spec="4 2,2")]
    assert layout(ShardByTaskPolicy()(tensors)) == [{"a": [""], "b": ["4 2,2"]}]
    assert ShardByTaskPolicy()([]) == []


def test_h3_policies_compare_and_hash_by_description_and_parameters() -> None:
    assert MaxShardSizePolicy(10) == MaxShardSizePolicy(10)
    assert hash(MaxShardSizePolicy(10)) == hash(MaxShardSizePolicy(10))
    assert MaxShardSizePolicy(10) != MaxShardSizePolicy(11)
    assert ShardByTaskPolicy() == ShardByTaskPolicy()
    assert ShardByTaskPolicy() != MaxShardSizePolicy(10)
    assert len({MaxShardSizePolicy(5), MaxShardSizePolicy(5), ShardByTaskPolicy()}) == 2
    assert "max shard size" in MaxShardSizePolicy(5).description
    assert repr(MaxShardSizePolicy(5)) == (
        "MaxShardSizePolicy(max_shard_size_bytes=5, slice_strings=True)"
    )
    assert MaxShardSizePolicy(5) != MaxShardSizePolicy(5, slice_strings=False)

    class Custom(ShardingPolicy):
        def __init__(self, n: int) -> None:
            self.n = n

        @property
        def description(self) -> str:
            return "custom"

        def __call__(self, shardable_tensors):  # noqa: ANN001, ANN204
            return []

    assert Custom(1) == Custom(1) and hash(Custom(1)) == hash(Custom(1))
    assert Custom(1) != Custom(2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True, None])
def test_max_shard_size_must_be_positive_int(bad) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match="max_shard_size_bytes"):
        MaxShardSizePolicy(bad)


def test_pre_sliced_value_with_wrong_shape_is_rejected(make_st) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match="'w'.*shape"):
        MaxShardSizePolicy(8)([make_st("w", np.ones((2, 2)), spec="4 4 0,2:0,3")])


def test_object_array_of_non_strings_is_rejected_naming_the_key(make_st) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match="'odd' holds a int"):
        MaxShardSizePolicy(8)([make_st("odd", np.array([1, b"x"], dtype=object))])
