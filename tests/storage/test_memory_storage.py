"""MemoryStorage: the conformance suite (as a local disk and as an object store), then its
specifics: fault injection, local vs object-store behaviour, fsync accounting."""

from __future__ import annotations

import errno

import pytest

from trackpoint.errors import CheckpointError, NotFoundError
from trackpoint.storage import MemoryStorage, Storage
from trackpoint.testing import StorageTests


class TestMemoryStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Storage:
        return MemoryStorage()

    @pytest.fixture
    def root(self, storage: Storage) -> str:
        storage.makedirs("/work/ckpt")
        return "/work/ckpt"


class TestMemoryStorageObjectStoreMode(StorageTests):
    atomic_rename = False

    @pytest.fixture
    def storage(self) -> Storage:
        return MemoryStorage(supports_atomic_rename=False)

    @pytest.fixture
    def root(self, storage: Storage) -> str:
        return "bucket/ckpt"


@pytest.fixture
def storage() -> MemoryStorage:
    storage = MemoryStorage()
    storage.makedirs("ckpt")
    return storage


def test_fail_writes_after_raises_disk_full_with_path(storage: MemoryStorage) -> None:
    storage.fail_writes_after(10)
    f = storage.open_write("ckpt/data")
    f.write(b"123456")
    with pytest.raises(CheckpointError, match="No space left on device while writing ckpt/data"):
        f.write(b"abcdefgh")
    f.close()
    # Like a full disk: the bytes that fit were stored.
    assert storage.read_bytes("ckpt/data") == b"123456abcd"
    assert storage.bytes_written == 10
    with pytest.raises(CheckpointError, match="No space left"), storage.open_write("ckpt/b") as g:
        g.write(b"x")
    storage.clear_faults()
    storage.write_bytes("ckpt/b", b"fits now")
    assert storage.read_bytes("ckpt/b") == b"fits now"


def test_fail_writes_after_custom_error(storage: MemoryStorage) -> None:
    storage.fail_writes_after(0, PermissionError(errno.EACCES, "denied"))
    with pytest.raises(CheckpointError, match="Permission denied while writing ckpt/f") as info:
        storage.write_bytes("ckpt/f", b"x")
    assert info.value.path == "ckpt/f"
    assert isinstance(info.value.__cause__, PermissionError)


def test_fault_hook_fails_chosen_operation(storage: MemoryStorage) -> None:
    storage.write_atomic("ckpt/state", b"old")
    seen: list[tuple[str, str]] = []

    def hook(operation: str, path: str) -> None:
        seen.append((operation, path))
        if operation == "replace":
            raise OSError(errno.EIO, "simulated I/O error")

    storage.set_fault_hook(hook)
    with pytest.raises(CheckpointError, match="OSError while renaming ckpt/state.tmp"):
        storage.write_atomic("ckpt/state", b"new")
    storage.clear_faults()
    assert storage.read_bytes("ckpt/state") == b"old"
    assert storage.list("ckpt") == ["state"]  # the temporary file was cleaned up
    assert [op for op, _ in seen][:3] == ["open_write", "write", "close"]


def test_fault_hook_non_os_error_passes_through(storage: MemoryStorage) -> None:
    class Crash(Exception):
        pass

    def hook(operation: str, path: str) -> None:
        if operation == "close":
            raise Crash

    storage.set_fault_hook(hook)
    with pytest.raises(Crash):
        storage.write_bytes("ckpt/f", b"x")


def test_local_mode_shows_partial_file_of_an_abandoned_write(storage: MemoryStorage) -> None:
    f = storage.open_write("ckpt/data")
    f.write(b"half")
    assert storage.read_bytes("ckpt/data") == b"half"  # what a crash now would leave


def test_local_mode_needs_parent_directory() -> None:
    storage = MemoryStorage()
    with pytest.raises(NotFoundError, match="call makedirs first"):
        storage.open_write("missing/f")


def test_object_store_mode_publishes_on_close() -> None:
    storage = MemoryStorage(supports_atomic_rename=False)
    f = storage.open_write("bucket/deep/key")  # no directories needed
    f.write(b"object")
    assert not storage.exists("bucket/deep/key")
    f.close()
    assert storage.read_bytes("bucket/deep/key") == b"object"
    assert storage.list("bucket") == ["deep"]


def test_reader_sees_snapshot(storage: MemoryStorage) -> None:
    storage.write_bytes("ckpt/f", b"first")
    reader = storage.open_range_reader("ckpt/f")
    storage.write_bytes("ckpt/f", b"second!")
    assert bytes(reader.read(0, reader.size)) == b"first"


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_count_follows_flag(fsync: bool) -> None:
    storage = MemoryStorage(fsync=fsync)
    storage.makedirs("d")
    storage.write_bytes("d/f", b"x")
    storage.sync_dir("d")
    assert storage.fsync_count == (2 if fsync else 0)
