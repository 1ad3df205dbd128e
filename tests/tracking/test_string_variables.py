"""String values (tf.string) in variables and tracked arrays: every byte survives (I3, H2).

Variables built from strings hold object arrays of bytes; tracked arrays keep their dtype and
are restored in place; a value a fixed-width holder would cut raises instead, changing nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable, Variable

KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"
BINARY = [b"", b"a", b"\x00\xff" * 1000, b"x" * 70000, b"ab\x00\x00", b"\x00"]
STRING_DTYPE = getattr(np.dtypes, "StringDType", None)


def _objects(values: list, shape: tuple[int, ...] | None = None) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array if shape is None else array.reshape(shape)


def _round_trip(tmp_path, value: np.ndarray, holder: np.ndarray) -> np.ndarray:
    prefix = tp.Checkpoint(v=Variable(value)).write(str(tmp_path / "ckpt"))
    target = Variable(holder)
    tp.Checkpoint(v=target).read(prefix).assert_consumed()
    return target.numpy()


@pytest.mark.parametrize("shape", [(6,), (2, 3), (3, 1, 2)], ids=["vector", "matrix", "rank3"])
def test_i3_bytes_variable_keeps_every_byte(tmp_path, shape) -> None:
    value = _objects(BINARY, shape)
    restored = _round_trip(tmp_path, value, np.full(shape, b"", dtype=object))
    assert restored.dtype == object and restored.shape == shape
    assert restored.reshape(-1).tolist() == BINARY
    assert all(type(item) is bytes for item in restored.flat)
    assert tp.load_variable(str(tmp_path / "ckpt"), KEY).reshape(-1).tolist() == BINARY


def test_i3_scalar_and_zero_size_strings(tmp_path) -> None:
    scalar = _round_trip(tmp_path, np.array(b"\x00x\x00", dtype=object), np.array(b"", object))
    assert scalar.shape == () and scalar[()] == b"\x00x\x00"
    empty = _round_trip(tmp_path, np.empty((0, 3), dtype=object), np.empty((0, 3), object))
    assert empty.shape == (0, 3) and empty.dtype == object


def test_variable_from_strings_holds_bytes() -> None:
    # Python bytes keep trailing NULs (numpy's inferred |S width would drop them).
    assert Variable([b"ab\x00", b""]).numpy().tolist() == [b"ab\x00", b""]
    assert Variable(b"x\x00").numpy()[()] == b"x\x00"
    # str is stored as UTF-8; bytes come back, as from a tf.string variable.
    v = Variable(np.array(["h\u00e9", "", "a\x00"], dtype=object))
    assert v.dtype == object and v.numpy().tolist() == [b"h\xc3\xa9", b"", b"a\x00"]
    assert Variable(["a", "bc"]).numpy().tolist() == [b"a", b"bc"]
    # Explicit fixed widths stay fixed.
    assert Variable([b"ab"], dtype="S4").dtype == np.dtype("S4")


def test_object_arrays_of_other_objects_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="dtype object holding int"):
        Variable(np.array([b"a", 1], dtype=object))
    with pytest.raises(InvalidArgumentError, match=r"dtype object holding NoneType \(element 0\)"):
        tp.Checkpoint(x=np.empty(2, dtype=object))
    with pytest.raises(InvalidArgumentError, match="dtype object holding dict"):
        Variable([b"a"]).assign([{}])


def test_h2_tracked_object_arrays_restore_in_place(tmp_path) -> None:
    blobs = _objects(BINARY)
    names = np.array(["alice", "b\u00f6b"], dtype=object)
    prefix = tp.Checkpoint(blobs=blobs, names=names).write(str(tmp_path / "ckpt"))
    live_blobs = np.full(len(BINARY), b"?", dtype=object)
    live_names = np.array(["", ""], dtype=object)
    tp.Checkpoint(blobs=live_blobs, names=live_names).read(prefix).assert_consumed()
    assert live_blobs.tolist() == BINARY
    # An object array of str stays one of str (decoded from UTF-8).
    assert live_names.tolist() == ["alice", "b\u00f6b"]


def test_fixed_width_holders_refuse_values_they_would_cut(tmp_path) -> None:
    prefix = tp.Checkpoint(a=Variable([b"ab\x00"]), b=Variable([b"abcde"]),
                           c=Variable([b"abc"]), u=Variable(["h\u00e9\x00"]),
                           x=Variable(np.float32(1))).write(str(tmp_path / "ckpt"))  # fmt: skip
    for name, holder, match in [
        ("a", np.array([b"zz"], "S4"), "ends with a NUL"),
        ("b", np.array([b"zz"], "S4"), "has 5 bytes, more than the 4"),
        ("u", np.array(["zz"], "U4"), "ends with a NUL"),
        ("c", np.array(["zz"], "U2"), "has 3 characters, more than the 2"),
    ]:
        x = np.zeros((), np.float32)
        with pytest.raises(InvalidArgumentError, match=match):
            tp.Checkpoint(x=x, **{name: holder}).read(prefix)
        assert holder.tolist() in (["zz"], [b"zz"]) and x == 0  # nothing changed
    fits = np.array([b"zz"], "S3")
    tp.Checkpoint(c=fits).read(prefix).expect_partial()
    assert fits.tolist() == [b"abc"]


def test_non_utf8_value_into_str_holder_raises(tmp_path) -> None:
    prefix = tp.Checkpoint(v=Variable([b"\xff"])).write(str(tmp_path / "ckpt"))
    holder = np.array(["ok"], dtype=object)
    with pytest.raises(InvalidArgumentError, match="not valid UTF-8"):
        tp.Checkpoint(v=holder).read(prefix)
    assert holder.tolist() == ["ok"]


def test_fixed_width_bytes_are_saved_as_numpy_reads_them(tmp_path) -> None:
    # numpy cannot tell trailing NULs of an |S element from padding: b"ab" is its value.
    prefix = tp.Checkpoint(v=np.array([b"ab\x00\x00", b"c"], "S4")).write(str(tmp_path / "c"))
    assert tp.load_variable(prefix, KEY).tolist() == [b"ab", b"c"]


def test_assign_strings() -> None:
    v = Variable([b"", b""])
    v.assign(["\u00e9", b"\x00"])
    assert v.numpy().tolist() == [b"\xc3\xa9", b"\x00"]
    fixed = Variable([b"ab"], dtype="S2")
    with pytest.raises(InvalidArgumentError, match="more than the 2"):
        fixed.assign([b"abc"])
    assert fixed.numpy().tolist() == [b"ab"]


@pytest.mark.skipif(STRING_DTYPE is None, reason="numpy 2's StringDType")
def test_string_dtype_variables_and_arrays(tmp_path) -> None:
    assert STRING_DTYPE is not None
    values = np.array(["a\x00", "", "\u00e9" * 40000], dtype=STRING_DTYPE())
    assert Variable(values).numpy().tolist() == [b"a\x00", b"", "\u00e9".encode() * 40000]
    prefix = tp.Checkpoint(v=values, w=Variable([b"\xff"])).write(str(tmp_path / "ckpt"))
    assert tp.load_variable(prefix, KEY)[0] == b"a\x00"
    holder = np.array(["", "", ""], dtype=STRING_DTYPE())
    typed = Variable(["", "", ""], dtype=STRING_DTYPE())
    tp.Checkpoint(v=holder).read(prefix).expect_partial()
    tp.Checkpoint(v=typed).read(prefix).expect_partial()
    assert holder.tolist() == values.tolist() == typed.numpy().tolist()
    with pytest.raises(InvalidArgumentError, match="not valid UTF-8"):
        tp.Checkpoint(w=np.array([""], dtype=STRING_DTYPE())).read(prefix)


def test_b1_string_variable_created_on_restore(tmp_path) -> None:
    root = AutoTrackable()
    root.names = Variable(_objects(BINARY[:3]))
    prefix = tp.Checkpoint(root=root).write(str(tmp_path / "ckpt"))
    fresh = AutoTrackable()
    status = tp.Checkpoint(root=fresh).read(prefix)
    created = fresh._add_variable("names")
    assert created.numpy().tolist() == BINARY[:3]
    status.assert_consumed()
