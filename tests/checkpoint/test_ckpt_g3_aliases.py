"""G3: an object that renamed a value reads checkpoints written under the old name, and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.tracking import Trackable


class _Table(Trackable):
    """Saves keys and values; ``names`` are the attribute names this version uses."""

    def __init__(self, names: tuple[str, str], aliases: Mapping[str, Sequence[str]] = ()):
        self.names = names
        self.aliases = dict(aliases)
        self.keys = np.zeros(3, np.int64)
        self.values = np.zeros(3, np.float32)

    def _serialize_to_tensors(self):
        return {self.names[0]: self.keys, self.names[1]: self.values}

    def _tensor_name_aliases(self):
        return self.aliases

    def _restore_from_tensors(self, restored):
        np.copyto(self.keys, restored[self.names[0]])
        np.copyto(self.values, restored[self.names[1]])


OLD = ("keys", "values")
NEW = ("table-keys", "table-values")


def _saved(tmp_path, names, aliases=()):
    table = _Table(names, aliases)
    table.keys[:] = [1, 2, 3]
    table.values[:] = [0.5, 1.5, 2.5]
    return tp.Checkpoint(table=table).write(str(tmp_path / "ckpt"))


def _check(table):
    assert table.keys.tolist() == [1, 2, 3]
    assert table.values.tolist() == [0.5, 1.5, 2.5]


def test_g3_new_code_reads_old_names_through_aliases(tmp_path):
    path = _saved(tmp_path, OLD)
    table = _Table(NEW, {"table-keys": ["keys"], "table-values": ["values"]})
    tp.Checkpoint(table=table).read(path).assert_consumed()
    _check(table)


def test_g3_old_code_with_forward_aliases_reads_new_names(tmp_path):
    path = _saved(tmp_path, NEW)
    table = _Table(OLD, {"keys": ["table-keys"], "values": ["table-values"]})
    tp.Checkpoint(table=table).read(path).assert_consumed()
    _check(table)


def test_g3_saving_uses_the_current_name(tmp_path):
    path = _saved(tmp_path, NEW, {"table-keys": ["keys"], "table-values": ["values"]})
    keys = {k for k, _ in tp.list_variables(path) if not k.startswith("_")}
    assert keys == {"table/.ATTRIBUTES/table-keys", "table/.ATTRIBUTES/table-values"}


def test_g3_without_aliases_a_rename_is_an_unmatched_object(tmp_path):
    path = _saved(tmp_path, OLD)
    table = _Table(NEW)
    status = tp.Checkpoint(table=table).read(path)
    with pytest.raises(AssertionError):
        status.assert_existing_objects_matched()
    status.expect_partial()
    assert table.keys.tolist() == [0, 0, 0]
