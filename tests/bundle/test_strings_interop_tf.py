"""tf.string values byte for byte, both ways, with real TensorFlow (I3, I8, H2).

TensorFlow reads the string variables trackpoint writes, and trackpoint reads TensorFlow's, with
equal bytes: empty strings, embedded and trailing NULs, elements over 64 KiB, scalars and
zero-size shapes. Plus the bundle layer on its own: StringDType and object arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import InvalidArgumentError

BINARY = [b"", b"a", b"\x00\xff" * 1000, b"x" * 70000, b"ab\x00\x00"]
KEYS = {
    name: f"{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in ("vector", "scalar", "empty", "matrix")
}
STRING_DTYPE = getattr(np.dtypes, "StringDType", None)


def _values() -> dict[str, np.ndarray]:
    vector = np.empty(len(BINARY), dtype=object)
    vector[:] = BINARY
    matrix = np.empty(4, dtype=object)
    matrix[:] = [b"\x00", b"", b"\xc3\xa9", b"z" * 65537]
    return {
        "vector": vector,
        "scalar": np.array(b"\x00scalar\x00", dtype=object),
        "empty": np.empty((0, 2), dtype=object),
        "matrix": matrix.reshape(2, 2),
    }


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.reshape(-1).tolist() == b.reshape(-1).tolist()


@pytest.mark.interop
def test_i3_tensorflow_reads_our_strings(tf, tmp_path) -> None:
    values = _values()
    prefix = tp.Checkpoint(**{k: tp.Variable(v) for k, v in values.items()}).write(
        str(tmp_path / "ours")
    )
    reader = tf.train.load_checkpoint(prefix)
    for name, value in values.items():
        assert _same(np.asarray(reader.get_tensor(KEYS[name]), dtype=object), value), name
    # And into tf.Variables through TF's own object-based restore.
    holders = {k: tf.Variable(np.full(v.shape, b"", dtype=object), dtype=tf.string)
               for k, v in values.items()}  # fmt: skip
    tf.train.Checkpoint(**holders).read(prefix).assert_consumed()
    for name, value in values.items():
        assert _same(np.asarray(holders[name].numpy(), dtype=object), value), name


@pytest.mark.interop
def test_i3_we_read_tensorflow_strings(tf, tmp_path) -> None:
    values = _values()
    variables = {k: tf.Variable(v, dtype=tf.string) for k, v in values.items()}
    prefix = tf.train.Checkpoint(**variables).write(str(tmp_path / "theirs"))
    for name, value in values.items():
        assert _same(tp.load_variable(prefix, KEYS[name]), value), name
    holders = {k: tp.Variable(np.full(v.shape, b"", dtype=object)) for k, v in values.items()}
    tp.Checkpoint(**holders).read(prefix).assert_consumed()
    for name, value in values.items():
        restored = holders[name].numpy()
        assert restored.dtype == object and _same(restored, value), name
        assert all(type(item) is bytes for item in restored.flat)


def test_bundle_string_kinds_round_trip(tmp_path) -> None:
    prefix = str(tmp_path / "b")
    writer = BundleWriter(prefix)
    writer.add("object", _values()["vector"])
    writer.add("str", np.array(["h\u00e9", "", "a\x00"], dtype=object))
    if STRING_DTYPE is not None:
        writer.add("T", np.array(["a\x00", "", "\u00e9"], dtype=STRING_DTYPE()))
    writer.finish()
    with BundleReader(prefix) as reader:
        assert reader.read("object").tolist() == BINARY
        assert reader.read("str").tolist() == [b"h\xc3\xa9", b"", b"a\x00"]
        if STRING_DTYPE is not None:
            assert reader.read("T").tolist() == [b"a\x00", b"", b"\xc3\xa9"]


def test_bundle_refuses_objects_that_are_not_strings(tmp_path) -> None:
    writer = BundleWriter(str(tmp_path / "b"))
    with pytest.raises(InvalidArgumentError, match="element 1 is int"):
        writer.add("bad", np.array([b"a", 3], dtype=object))
    writer.abort()
