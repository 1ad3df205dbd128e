"""Golden checkpoints written by TensorFlow 2.21 (tests/golden/bundle/, see
scripts/make_golden_bundle.py): we read them exactly and re-create their bytes, without TF."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trackpoint.bundle import BundleReader, BundleWriter, TensorSlice, merge_bundles
from trackpoint.management import CheckpointReader

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "bundle"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())["checkpoints"]


def expected_array(item: dict) -> np.ndarray:
    shape = tuple(item["shape"])
    if item["dtype"] == "string":
        values = [bytes.fromhex(h) for h in item["hex"]]
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out.reshape(shape)
    name = item["dtype"]
    dtype = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    return np.frombuffer(bytes.fromhex(item["hex"]), dtype=dtype).reshape(shape)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_read_tensorflow_golden(name):
    with CheckpointReader(str(GOLDEN / name)) as reader:
        for item in MANIFEST[name]:
            expected = expected_array(item)
            got = reader.get_tensor(item["key"])
            assert got.shape == expected.shape
            assert got.dtype == expected.dtype, item["key"]
            if expected.dtype == object:
                assert got.tolist() == expected.tolist()
            else:
                assert got.tobytes() == expected.tobytes(), item["key"]
        reader.bundle.verify()


def test_golden_dtypes_rewritten_byte_identical(tmp_path):
    prefix = str(tmp_path / "dtypes")
    with BundleWriter(prefix) as writer:
        for item in MANIFEST["dtypes"]:
            writer.add(item["key"], expected_array(item))
    for suffix in (".index", ".data-00000-of-00001"):
        assert Path(prefix + suffix).read_bytes() == (GOLDEN / ("dtypes" + suffix)).read_bytes()


def test_golden_sliced_merge_byte_identical(tmp_path):
    full = expected_array(MANIFEST["sliced"][0])
    values = {item["key"]: expected_array(item) for item in MANIFEST["sliced"]}
    part0, part1 = str(tmp_path / "tmp" / "part-0"), str(tmp_path / "tmp" / "part-1")
    with BundleWriter(part0) as writer:
        writer.add_slice("t", (5, 10), "0,2:0,10", full[:2])
        writer.add("a", values["a"])
    with BundleWriter(part1) as writer:
        writer.add_slice("t", (5, 10), "2,3:0,10", full[2:])
        writer.add("b", values["b"])
    out = str(tmp_path / "sliced")
    merge_bundles([part0, part1], out)
    for suffix in (".index", ".data-00000-of-00002", ".data-00001-of-00002"):
        assert Path(out + suffix).read_bytes() == (GOLDEN / ("sliced" + suffix)).read_bytes()


def test_golden_sliced_structure():
    with BundleReader(str(GOLDEN / "sliced")) as reader:
        assert reader.num_shards == 2
        assert reader.slices("t") == [TensorSlice((0, 0), (2, 10)), TensorSlice((2, 0), (3, 10))]
        full = np.arange(50, dtype=np.float32).reshape(5, 10)
        np.testing.assert_array_equal(reader.read_slice("t", "1,3:4,2"), full[1:4, 4:6])


def test_golden_object_checkpoint_matches_worked_example(tmp_path):
    prefix = GOLDEN / "object" / "ckpt-1"
    index = Path(str(prefix) + ".index").read_bytes()
    assert len(index) == 249
    assert index[-8:] == bytes.fromhex("57fb808b247547db")
    with CheckpointReader(str(prefix)) as reader:
        assert reader.keys() == [
            "_CHECKPOINTABLE_OBJECT_GRAPH",
            "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
            "v/.ATTRIBUTES/VARIABLE_VALUE",
        ]
        graph = reader.object_graph()
        assert graph is not None
        assert [c.local_name for c in graph.nodes[0].children] == ["v", "save_counter"]
        assert graph.nodes[1].attributes[0].checkpoint_key == "v/.ATTRIBUTES/VARIABLE_VALUE"
        assert reader.get_variable_to_dtype_map()["v/.ATTRIBUTES/VARIABLE_VALUE"] == np.float32
        assert reader.get_variable_to_shape_map()["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == []
    # Our writer re-creates both files from the same tensors in TF's data order.
    with CheckpointReader(str(prefix)) as reader:
        values = {k: reader.get_tensor(k) for k in reader.keys()}
    ours = str(tmp_path / "ckpt-1")
    with BundleWriter(ours) as writer:
        for key in [
            "v/.ATTRIBUTES/VARIABLE_VALUE",
            "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
            "_CHECKPOINTABLE_OBJECT_GRAPH",
        ]:
            writer.add(key, values[key])
    assert Path(ours + ".index").read_bytes() == index
    assert (
        Path(ours + ".data-00000-of-00001").read_bytes()
        == Path(str(prefix) + ".data-00000-of-00001").read_bytes()
    )


def test_checkpoint_reader_without_object_graph_and_missing(tmp_path):
    shutil.copy(GOLDEN / "dtypes.index", tmp_path / "d.index")
    with CheckpointReader(str(tmp_path / "d")) as reader:
        assert reader.object_graph() is None
        assert reader.has_tensor("scalar")
    with pytest.raises(FileNotFoundError):
        CheckpointReader(os.path.join(tmp_path, "nope"))
