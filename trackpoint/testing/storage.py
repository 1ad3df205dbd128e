"""The storage conformance suite: ``StorageTests``, for every ``Storage`` implementation.

trackpoint runs it against its own backends (``LocalStorage``, ``MemoryStorage``,
``FsspecStorage``); a third-party storage subclasses it to show it keeps the contract the saver
and the reader rely on (docs/storage.md). As zarr ships ``zarr.testing.store.StoreTests``.

This is the one module of trackpoint that imports pytest; ``import trackpoint`` never imports
it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from trackpoint.errors import CheckpointError, DataLossError, NotFoundError
from trackpoint.storage import Storage

__all__ = ["StorageTests"]


class StorageTests:
    """Behaviour every :class:`~trackpoint.storage.Storage` must have, as pytest tests.

    Subclass it in a test module under a name pytest collects (``Test…``) and override the two
    fixtures; set :attr:`atomic_rename` to what the storage declares. The tests only call the
    ``Storage`` interface, each in a fresh ``root``; they write a few MB at most.

    Example::

        class TestMyStorage(StorageTests):
            atomic_rename = False  # an object store

            @pytest.fixture
            def storage(self) -> Storage:
                return MyStorage(bucket="test")

            @pytest.fixture
            def root(self, storage: Storage) -> str:
                return f"my://test/{uuid.uuid4().hex}"  # an empty directory, in its syntax
    """

    atomic_rename: bool = True
    """The ``supports_atomic_rename`` the storage under test must declare: False for object
    stores, whose ``replace`` may copy and whose atomic writes upload whole objects."""

    @pytest.fixture
    def storage(self) -> Storage:
        """The storage under test (override)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override the `storage` fixture with the Storage to test"
        )

    @pytest.fixture
    def root(self, storage: Storage) -> str:
        """An existing, empty directory in ``storage``'s path syntax, one per test (override)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override the `root` fixture with an empty directory"
        )

    # -- capabilities -------------------------------------------------------------------
    def test_supports_atomic_rename(self, storage: Storage) -> None:
        assert storage.supports_atomic_rename is self.atomic_rename

    # -- writing and reading ------------------------------------------------------------
    def test_round_trip_bytes(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "a.bin")
        storage.write_bytes(path, b"hello world")
        assert storage.read_bytes(path) == b"hello world"
        assert storage.size(path) == 11
        assert storage.exists(path)

    def test_round_trip_mixed_writes(self, storage: Storage, root: str) -> None:
        # Small writes are buffered, big ones bypass the buffer: the order must survive both.
        big = np.arange(600_000, dtype=np.float32)  # 2.4 MB, above any write buffer
        path = storage.join(root, "mixed")
        with storage.open_write(path) as f:
            assert f.write(b"head") == 4
            assert f.write(big) == big.nbytes
            assert f.write(memoryview(b"mid")) == 3
            assert f.write(big[:10]) == 40
            assert f.write(bytearray(b"tail")) == 4
            assert f.tell() == 4 + big.nbytes + 3 + 40 + 4
        expected = b"head" + big.tobytes() + b"mid" + big[:10].tobytes() + b"tail"
        assert storage.read_bytes(path) == expected

    def test_open_write_truncates(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "f")
        storage.write_bytes(path, b"long old content")
        storage.write_bytes(path, b"new")
        assert storage.read_bytes(path) == b"new"

    def test_range_reads(self, storage: Storage, root: str) -> None:
        data = bytes(range(256)) * 10
        path = storage.join(root, "r")
        storage.write_bytes(path, data)
        with storage.open_range_reader(path) as reader:
            assert reader.size == len(data)
            assert bytes(reader.read(0, 3)) == data[:3]
            assert bytes(reader.read(1000, 500)) == data[1000:1500]
            assert bytes(reader.read(len(data) - 7, 7)) == data[-7:]
            assert bytes(reader.read(17, 0)) == b""
            assert isinstance(reader.read(5, 5), memoryview)
            mapped = reader.mapped()  # the whole file in memory, or None (read() per range)
            assert mapped is None or bytes(mapped) == data

    def test_range_read_past_end_is_data_loss(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "short")
        storage.write_bytes(path, b"0123456789")
        with storage.open_range_reader(path) as reader:
            with pytest.raises(DataLossError, match="Requested 8 bytes but read 4") as info:
                reader.read(6, 8)
            assert info.value.path == path
            with pytest.raises(DataLossError, match="Requested 1 bytes but read 0"):
                reader.read(10, 1)

    def test_empty_file(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "empty")
        storage.write_bytes(path, b"")
        assert storage.size(path) == 0
        with storage.open_range_reader(path) as reader:
            assert reader.size == 0
            assert bytes(reader.read(0, 0)) == b""
            with pytest.raises(DataLossError, match="Requested 1 bytes but read 0"):
                reader.read(0, 1)

    # -- missing files ------------------------------------------------------------------
    def test_missing_file_is_not_found(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "nope")
        assert not storage.exists(path)
        for call in (
            lambda: storage.open_range_reader(path),
            lambda: storage.read_bytes(path),
            lambda: storage.size(path),
            lambda: storage.remove(path, missing_ok=False),
        ):
            with pytest.raises(NotFoundError) as info:
                call()
            assert isinstance(info.value, FileNotFoundError)
            assert info.value.path == path
            assert path in str(info.value)

    def test_remove(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "gone")
        storage.write_bytes(path, b"x")
        storage.remove(path)
        assert not storage.exists(path)
        storage.remove(path)  # missing_ok defaults to True
        storage.remove(path, missing_ok=True)

    # -- replace and atomic writes ------------------------------------------------------
    def test_replace_moves_and_overwrites(self, storage: Storage, root: str) -> None:
        src, dst = storage.join(root, "src"), storage.join(root, "dst")
        storage.write_bytes(src, b"new")
        storage.write_bytes(dst, b"old contents")
        storage.replace(src, dst)
        assert not storage.exists(src)
        assert storage.read_bytes(dst) == b"new"
        assert storage.list(root) == ["dst"]

    def test_replace_missing_source(self, storage: Storage, root: str) -> None:
        src, dst = storage.join(root, "src"), storage.join(root, "dst")
        storage.write_bytes(dst, b"keep")
        with pytest.raises(NotFoundError) as info:
            storage.replace(src, dst)
        assert info.value.path == src
        assert storage.read_bytes(dst) == b"keep"

    def test_write_atomic_leaves_no_temporary_files(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "state")
        storage.write_atomic(path, b"v1")
        storage.write_atomic(path, b"version 2")
        assert storage.read_bytes(path) == b"version 2"
        assert storage.list(root) == ["state"]

    def test_write_atomic_failure_keeps_old_file(
        self, storage: Storage, root: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = storage.join(root, "state")
        storage.write_atomic(path, b"old")

        def broken_replace(src: str, dst: str) -> None:
            raise CheckpointError("simulated crash before the rename", path=src)

        monkeypatch.setattr(storage, "replace", broken_replace)
        if self.atomic_rename:
            with pytest.raises(CheckpointError, match="simulated crash"):
                storage.write_atomic(path, b"new")
            assert storage.read_bytes(path) == b"old"
        else:  # whole-object writes need no rename
            storage.write_atomic(path, b"new")
            assert storage.read_bytes(path) == b"new"
        assert storage.list(root) == ["state"]

    def test_open_atomic_streams_and_an_error_leaves_no_part_file(
        self, storage: Storage, root: str
    ) -> None:
        path = storage.join(root, "export.bin")
        with storage.open_atomic(path) as out:
            out.write(b"first ")
            out.write(b"second")
        assert storage.read_bytes(path) == b"first second"
        other = storage.join(root, "broken.bin")

        def write_half() -> None:
            with storage.open_atomic(other) as out:
                out.write(b"half")
                raise RuntimeError("mid-write")

        with pytest.raises(RuntimeError, match="mid-write"):
            write_half()
        assert not storage.exists(other)
        assert storage.list(root) == ["export.bin"]

    # -- directories --------------------------------------------------------------------
    def test_makedirs_list_and_remove_tree(self, storage: Storage, root: str) -> None:
        sub = storage.join(root, "a", "b")
        storage.makedirs(sub)
        storage.makedirs(sub)  # idempotent
        storage.write_bytes(storage.join(sub, "f2"), b"2")
        storage.write_bytes(storage.join(sub, "f1"), b"1")
        storage.write_bytes(storage.join(root, "top"), b"t")
        assert storage.list(sub) == ["f1", "f2"]
        assert storage.list(root) == ["a", "top"]
        assert storage.exists(storage.join(root, "a"))
        storage.remove_tree(storage.join(root, "a"))
        assert storage.list(root) == ["top"]
        assert not storage.exists(storage.join(sub, "f1"))
        storage.remove_tree(storage.join(root, "a"))  # missing: no error

    def test_list_missing_directory_is_empty(self, storage: Storage, root: str) -> None:
        assert storage.list(storage.join(root, "missing")) == []

    def test_sync_dir(self, storage: Storage, root: str) -> None:
        storage.write_bytes(storage.join(root, "f"), b"x")
        storage.sync_dir(root)  # must not fail on any backend

    def test_path_helpers(self, storage: Storage, root: str) -> None:
        path = storage.join(root, "dir", "ckpt-1.index")
        assert storage.basename(path) == "ckpt-1.index"
        assert storage.dirname(storage.dirname(path)) == root
        assert storage.join(root, "x").startswith(root)

    # -- concurrency --------------------------------------------------------------------
    def test_concurrent_writes_and_reads(self, storage: Storage, root: str) -> None:
        payloads = {f"shard-{i}": np.full(50_000, i, dtype=np.int32) for i in range(6)}
        errors: list[BaseException] = []

        def write(name: str, array: np.ndarray) -> None:
            try:
                storage.write_bytes(storage.join(root, name), memoryview(array))
            except BaseException as exc:  # collected and re-checked in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=write, args=item) for item in payloads.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert storage.list(root) == sorted(payloads)

        reader = storage.open_range_reader(storage.join(root, "shard-3"))
        results: dict[int, bytes] = {}

        def read(i: int) -> None:
            results[i] = bytes(reader.read(i * 4000, 4000))

        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reader.close()
        expected = payloads["shard-3"].tobytes()
        assert results == {i: expected[i * 4000 : (i + 1) * 4000] for i in range(8)}
