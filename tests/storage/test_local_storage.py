"""LocalStorage: the conformance suite (plain paths and ``file://`` URLs), then its specifics:
fsync, mmap zero-copy reads, unbuffered big writes, OSError mapping."""

from __future__ import annotations

import errno
import io
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from trackpoint.errors import CheckpointError, DataLossError, NotFoundError
from trackpoint.storage import LocalStorage, Storage
from trackpoint.testing import StorageTests


class TestLocalStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Storage:
        return LocalStorage()

    @pytest.fixture
    def root(self, storage: Storage, tmp_path_factory: pytest.TempPathFactory) -> str:
        return str(tmp_path_factory.mktemp("local"))


class TestLocalStorageFileUrls(StorageTests):
    @pytest.fixture
    def storage(self) -> Storage:
        return LocalStorage(fsync=False)

    @pytest.fixture
    def root(self, storage: Storage, tmp_path_factory: pytest.TempPathFactory) -> str:
        return "file://" + str(tmp_path_factory.mktemp("local-url"))


@pytest.fixture
def fsync_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return calls


def test_fsync_on_close_and_sync_dir(tmp_path: Path, fsync_calls: list[int]) -> None:
    storage = LocalStorage(fsync=True)
    storage.write_bytes(str(tmp_path / "f"), b"data")
    assert len(fsync_calls) == 1
    storage.sync_dir(str(tmp_path))
    assert len(fsync_calls) == 2
    storage.write_atomic(str(tmp_path / "state"), b"x")  # file, then its directory
    assert len(fsync_calls) == 4


def test_fsync_false_never_syncs(tmp_path: Path, fsync_calls: list[int]) -> None:
    storage = LocalStorage(fsync=False)
    storage.write_bytes(str(tmp_path / "f"), b"data")
    storage.sync_dir(str(tmp_path))
    storage.write_atomic(str(tmp_path / "state"), b"x")
    assert fsync_calls == []
    assert (tmp_path / "f").read_bytes() == b"data"


def test_reads_are_zero_copy_views_of_one_mapping(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    LocalStorage().write_bytes(path, np.arange(1000, dtype=np.int64))
    reader = LocalStorage().open_range_reader(path)
    first = np.frombuffer(reader.read(0, 800), dtype=np.int64)
    second = np.frombuffer(reader.read(400, 400), dtype=np.int64)
    assert np.shares_memory(first, second)
    assert reader.read(0, 8).readonly
    whole = np.frombuffer(reader.mapped(), dtype=np.int64)  # the same mapping, whole
    assert np.shares_memory(whole, first) and whole[999] == 999
    reader.close()
    # Views still referenced keep the mapping alive after close().
    assert first[-1] == 99
    assert second[0] == 50


def test_big_write_is_not_copied(tmp_path: Path) -> None:
    array = np.ones(16 << 20, dtype=np.uint8)  # 16 MiB
    storage = LocalStorage(fsync=False)
    tracemalloc.start()
    try:
        with storage.open_write(str(tmp_path / "big")) as f:
            f.write(b"small header")
            f.write(array)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < array.nbytes // 4
    assert os.path.getsize(tmp_path / "big") == 12 + array.nbytes


def test_non_contiguous_buffer_is_rejected(tmp_path: Path) -> None:
    array = np.arange(20, dtype=np.int32)[::2]
    with (
        LocalStorage().open_write(str(tmp_path / "f")) as f,
        pytest.raises(ValueError, match="C-contiguous"),
    ):
        f.write(array)


def test_truncated_file_names_path(tmp_path: Path) -> None:
    path = str(tmp_path / "data-00000-of-00001")
    LocalStorage().write_bytes(path, b"abc")
    with (
        LocalStorage().open_range_reader(path) as reader,
        pytest.raises(DataLossError, match=rf"Requested 10 bytes but read 1 .*{path}"),
    ):
        reader.read(2, 10)


def test_missing_parent_directory(tmp_path: Path) -> None:
    path = str(tmp_path / "no" / "such" / "f")
    with pytest.raises(NotFoundError, match="No such file or directory while opening") as info:
        LocalStorage().open_write(path)
    assert info.value.path == path
    assert isinstance(info.value.__cause__, FileNotFoundError)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux /dev/full")
def test_disk_full_from_dev_full() -> None:
    storage = LocalStorage(fsync=False)  # fsync on a character device is not meaningful
    f = storage.open_write("/dev/full")
    with pytest.raises(CheckpointError, match="No space left on device while writing /dev/full"):
        f.write(np.zeros(4 << 20, dtype=np.uint8))  # big: written through immediately
    f.close()  # after a failed write, close() releases the descriptor without raising again
    assert f.closed


class _FullDiskFile(io.FileIO):
    def write(self, data: object) -> int:
        if self.closed:  # what the real FileIO does; a second flush after close must not reach it
            raise ValueError("write to closed file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_on_buffered_write_surfaces_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(io, "FileIO", _FullDiskFile)
    path = str(tmp_path / "f")
    f = LocalStorage().open_write(path)
    f.write(b"small write, only buffered")
    with pytest.raises(
        CheckpointError, match=f"No space left on device while writing {path}"
    ) as info:
        f.close()
    assert info.value.path == path
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert f.closed


@pytest.mark.parametrize(
    ("error", "expected_type", "message"),
    [
        (OSError(errno.ENOENT, "missing"), NotFoundError, "No such file or directory"),
        (OSError(errno.ENOSPC, "full"), CheckpointError, "No space left on device"),
        (PermissionError(errno.EACCES, "denied"), CheckpointError, "Permission denied"),
        (OSError(errno.EPERM, "not permitted"), CheckpointError, "Permission denied"),
        (OSError(errno.EIO, "I/O error"), CheckpointError, "OSError while renaming"),
    ],
)
def test_os_errors_are_mapped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: OSError,
    expected_type: type[CheckpointError],
    message: str,
) -> None:
    def failing_replace(src: str, dst: str) -> None:
        raise error

    monkeypatch.setattr(os, "replace", failing_replace)
    src, dst = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(expected_type, match=message) as info:
        LocalStorage().replace(src, dst)
    assert type(info.value) is expected_type
    assert info.value.path == src
    assert src in str(info.value)
    assert dst in str(info.value)
    assert info.value.__cause__ is error


def test_permission_denied_on_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class DeniedFile(io.FileIO):
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(io, "FileIO", DeniedFile)
    path = str(tmp_path / "f")
    with pytest.raises(CheckpointError, match=f"Permission denied while opening for write {path}"):
        LocalStorage().open_write(path)


def test_file_urls_are_local(tmp_path: Path) -> None:
    storage = LocalStorage()
    url = f"file://{tmp_path}/f"
    storage.write_bytes(url, b"via url")
    assert (tmp_path / "f").read_bytes() == b"via url"
    assert storage.read_bytes(url) == b"via url"
    assert storage.list(f"file://{tmp_path}") == ["f"]
