"""Atomic commit: a failure at any step leaves the previous checkpoint and no partial one."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import zlib

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import CheckpointError, NotFoundError
from trackpoint.saving import CheckpointOptions, MaxShardSizePolicy, MultiDeviceSaver
from trackpoint.saving import commit as commit_module
from trackpoint.storage import LocalStorage, MemoryStorage

OPTIONS = CheckpointOptions(sharding_policy=MaxShardSizePolicy(64))


def _values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal((8, 5)).astype(np.float32),
        "b/.ATTRIBUTES/VARIABLE_VALUE": rng.integers(0, 100, 20),
        "c/.ATTRIBUTES/VARIABLE_VALUE": np.array([b"x" * seed, b"yz"], dtype=object),
    }


def _save(prefix: str, seed: int, storage=None, options=OPTIONS) -> str:  # noqa: ANN001
    return MultiDeviceSaver({None: _values(seed)}).save(prefix, options, storage=storage)


def _assert_reads(prefix: str, seed: int, storage=None) -> None:  # noqa: ANN001
    with BundleReader(prefix, storage=storage) as reader:
        expected = _values(seed)
        assert sorted(reader.keys()) == sorted(expected)
        for key, value in expected.items():
            assert reader.read(key).tolist() == value.tolist()


def _count_operations(storage: MemoryStorage, fn) -> int:  # noqa: ANN001
    count = 0

    def hook(operation: str, path: str) -> None:
        nonlocal count
        count += 1

    storage.set_fault_hook(hook)
    fn()
    storage.clear_faults()
    return count


class Injected(OSError):
    pass


def _fail_at(storage: MemoryStorage, n: int) -> list[tuple[str, str]]:
    """Fail the ``n``-th storage operation (0-based), once; returns the operations seen."""
    seen: list[tuple[str, str]] = []

    def hook(operation: str, path: str) -> None:
        seen.append((operation, path))
        if len(seen) - 1 == n:
            raise Injected(f"injected failure in {operation} {path}")

    storage.set_fault_hook(hook)
    return seen


@pytest.mark.parametrize("atomic_rename", [True, False], ids=["local-like", "object-store"])
def test_failure_at_every_storage_operation_keeps_previous_checkpoint(atomic_rename) -> None:  # noqa: ANN001
    storage = MemoryStorage(supports_atomic_rename=atomic_rename)
    _save("mem/ckpt-1", 1, storage)
    listing = storage.list("mem")
    total = _count_operations(storage, lambda: _save("mem/probe", 2, storage))
    storage.remove_tree("mem")
    _save("mem/ckpt-1", 1, storage)
    assert total > 30
    committed = failed = 0
    for n in range(total):
        seen = _fail_at(storage, n)
        try:
            _save("mem/ckpt-2", 2, storage)
        except CheckpointError:
            failed += 1
            storage.clear_faults()
            assert not storage.exists("mem/ckpt-2.index"), seen[-1]
            assert storage.list("mem") == listing, seen[-1]  # everything of the save removed
        else:
            # The failure hit a cleanup step after the commit point: the save stands.
            committed += 1
            storage.clear_faults()
            _assert_reads("mem/ckpt-2", 2, storage)
            storage.remove("mem/ckpt-2.index")
            for name in storage.list("mem"):
                if name.startswith("ckpt-2"):
                    storage.remove_tree(f"mem/{name}")
                    storage.remove(f"mem/{name}")
        _assert_reads("mem/ckpt-1", 1, storage)
    assert failed > 20 and committed >= 1


@pytest.mark.parametrize("new_seed", [3, 40], ids=["same-shard-count", "other-shard-count"])
def test_failed_overwrite_of_same_prefix_is_old_or_absent_never_mixed(new_seed) -> None:  # noqa: ANN001
    storage = MemoryStorage()
    total = _count_operations(storage, lambda: _save("mem/ckpt", 1, storage))
    for n in range(total):
        storage.remove_tree("mem")
        _save("mem/ckpt", 1, storage)
        _fail_at(storage, n)
        try:
            _save("mem/ckpt", new_seed, storage)
        except CheckpointError:
            storage.clear_faults()
            if storage.exists("mem/ckpt.index"):
                _assert_reads("mem/ckpt", 1, storage)
            else:
                with pytest.raises(NotFoundError):
                    BundleReader("mem/ckpt", storage=storage)
            assert all("_temp_" not in name for name in storage.list("mem"))
        else:
            storage.clear_faults()
            _assert_reads("mem/ckpt", new_seed, storage)


def test_full_disk_midway_through_a_shard(tmp_path) -> None:  # noqa: ANN001
    storage = MemoryStorage()
    _save("mem/ckpt-1", 1, storage)
    listing = storage.list("mem")
    for budget in (0, 10, 100, 250, 400):
        storage.fail_writes_after(budget)
        with pytest.raises(CheckpointError, match="No space left"):
            _save("mem/ckpt-2", 2, storage)
        storage.clear_faults()
        assert storage.list("mem") == listing
        _assert_reads("mem/ckpt-1", 1, storage)


def test_failing_shard_writer_on_local_disk_rolls_back(prefix, monkeypatch) -> None:  # noqa: ANN001
    from trackpoint.bundle import writer as writer_module

    directory = os.path.dirname(prefix)
    _save(prefix + "-1", 1)
    before = sorted(os.listdir(directory))
    calls = {"n": 0}
    original = writer_module.BundleWriter.finish

    def finish_then_fail(self) -> None:  # noqa: ANN001
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk went away")
        original(self)

    monkeypatch.setattr(writer_module.BundleWriter, "finish", finish_then_fail)
    with pytest.raises(OSError, match="disk went away"):
        _save(prefix + "-2", 2)
    assert sorted(os.listdir(directory)) == before
    _assert_reads(prefix + "-1", 1)


def test_failing_index_rename_on_local_disk_rolls_back(prefix, monkeypatch) -> None:  # noqa: ANN001
    directory = os.path.dirname(prefix)
    _save(prefix + "-1", 1)
    before = sorted(os.listdir(directory))
    original = LocalStorage.replace

    def replace(self, src: str, dst: str) -> None:  # noqa: ANN001
        if dst.endswith("ckpt-2.index"):
            raise OSError("rename failed")
        original(self, src, dst)

    monkeypatch.setattr(LocalStorage, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        _save(prefix + "-2", 2)
    assert sorted(os.listdir(directory)) == before
    _assert_reads(prefix + "-1", 1)


def test_shards_go_to_a_private_temp_folder_then_into_place(prefix, monkeypatch) -> None:  # noqa: ANN001
    seen = {}
    original = commit_module.AtomicCommit.commit

    def spy(self, inputs) -> None:  # noqa: ANN001
        seen["inputs"] = list(inputs)
        seen["files"] = sorted(os.listdir(self.temp_dir))
        seen["final"] = os.path.exists(prefix + ".index")
        original(self, inputs)

    monkeypatch.setattr(commit_module.AtomicCommit, "commit", spy)
    _save(prefix, 1)
    temp = os.path.dirname(seen["inputs"][0])
    token = f"{zlib.crc32(socket.gethostname().encode()):08x}{os.getpid():08x}"
    assert re.fullmatch(re.escape(prefix) + "_temp_" + token + "[0-9a-f]{8}", temp)
    n = len(seen["inputs"])
    assert n > 1 and seen["final"] is False
    assert seen["inputs"] == [os.path.join(temp, f"part-{i:05d}-of-{n:05d}") for i in range(n)]
    assert seen["files"] == sorted(
        [f"part-{i:05d}-of-{n:05d}.index" for i in range(n)]
        + [f"part-{i:05d}-of-{n:05d}.data-00000-of-00001" for i in range(n)]
    )
    assert sorted(os.listdir(os.path.dirname(prefix))) == sorted(
        ["ckpt.index"] + [f"ckpt.data-{i:05d}-of-{n:05d}" for i in range(n)]
    )


def test_object_store_uses_part_names_next_to_final_files(monkeypatch) -> None:  # noqa: ANN001
    pytest.importorskip("fsspec")
    from trackpoint.storage import storage_for

    prefix = "memory://saving-test/objects/ckpt"
    storage = storage_for(prefix)
    assert not storage.supports_atomic_rename
    seen = {}
    original = commit_module.AtomicCommit.commit

    def spy(self, inputs) -> None:  # noqa: ANN001
        seen["inputs"] = list(inputs)
        seen["files"] = storage.list("memory://saving-test/objects")
        original(self, inputs)

    monkeypatch.setattr(commit_module.AtomicCommit, "commit", spy)
    try:
        _save(prefix, 1)
        n = len(seen["inputs"])
        assert seen["inputs"] == [f"{prefix}.part-{i:05d}-of-{n:05d}" for i in range(n)]
        assert "ckpt.index" not in seen["files"]
        assert f"ckpt.part-00000-of-{n:05d}.index" in seen["files"]
        assert storage.list("memory://saving-test/objects") == sorted(
            ["ckpt.index"] + [f"ckpt.data-{i:05d}-of-{n:05d}" for i in range(n)]
        )
        _assert_reads(prefix, 1)
    finally:
        storage.remove_tree("memory://saving-test")


def test_overwrite_with_other_shard_count_removes_old_data_files(prefix) -> None:  # noqa: ANN001
    _save(prefix, 1, options=CheckpointOptions(sharding_policy=MaxShardSizePolicy(16)))
    old = [n for n in os.listdir(os.path.dirname(prefix)) if ".data-" in n]
    _save(prefix, 2, options=CheckpointOptions())
    assert sorted(os.listdir(os.path.dirname(prefix))) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    assert len(old) > 1
    _assert_reads(prefix, 2)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temp_folders_are_ignored_and_cleaned(prefix) -> None:  # noqa: ANN001
    directory = os.path.dirname(prefix)
    host = f"{zlib.crc32(socket.gethostname().encode()):08x}"
    names = {
        f"crashed-1_temp_{host}{_dead_pid():08x}0badc0de": False,
        f"crashed-2_temp_{host}{_dead_pid():08x}12345678": False,
        f"live_temp_{host}{os.getppid():08x}00000000": True,  # a running process
        f"mine_temp_{host}{os.getpid():08x}00000000": True,  # an in-flight save of ours
        f"other-host_temp_{zlib.crc32(b'elsewhere') ^ 1:08x}{_dead_pid():08x}00000000": True,
        "unowned_temp_0123456789abcdef": True,  # not our naming: never touched
    }
    for name in names:
        os.makedirs(os.path.join(directory, name))
        with open(os.path.join(directory, name, "part-00000-of-00001.index"), "wb") as f:
            f.write(b"partial")
    with pytest.raises(NotFoundError):
        BundleReader(os.path.join(directory, "crashed-1"))
    _save(prefix, 1)
    _assert_reads(prefix, 1)
    remaining = sorted(n for n in os.listdir(directory) if "_temp_" in n)
    assert remaining == sorted(name for name, kept in names.items() if kept)


def test_fsync_option_controls_fsyncs(prefix, monkeypatch) -> None:  # noqa: ANN001
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    _save(prefix + "-a", 1, options=CheckpointOptions(sharding_policy=MaxShardSizePolicy(64),
                                                      fsync=False))
    assert calls == []
    _save(prefix + "-b", 1)
    n = len([name for name in os.listdir(os.path.dirname(prefix)) if "-b.data-" in name])
    assert len(calls) >= n + 2  # every data file, the index, and the directory


def test_relative_prefix_in_the_working_directory(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    _save("ckpt", 1)
    _save("ckpt", 2)  # overwrite: same shard count
    _save("ckpt", 3, options=CheckpointOptions())  # overwrite: other shard count
    assert sorted(os.listdir(tmp_path)) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    _assert_reads("ckpt", 3)
