"""FsspecStorage: the conformance suite (fsspec's ``memory://`` and S3 on a moto server), then
its specifics: URL path helpers, whole-object commits, error mapping."""

from __future__ import annotations

import errno
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from trackpoint.errors import CheckpointError, InvalidArgumentError, NotFoundError
from trackpoint.storage import FsspecStorage, Storage
from trackpoint.testing import StorageTests

fsspec = pytest.importorskip("fsspec")


class TestFsspecMemoryStorage(StorageTests):
    atomic_rename = False

    @pytest.fixture
    def storage(self) -> Storage:
        return FsspecStorage(fsspec.filesystem("memory"))

    @pytest.fixture
    def root(self, storage: Storage) -> Iterator[str]:
        root = f"memory://trackpoint-{uuid.uuid4().hex}"
        storage.makedirs(root)
        yield root
        storage.remove_tree(root)


class TestFsspecS3Storage(StorageTests):
    """FsspecStorage on a real S3 protocol server (moto); needs s3fs."""

    atomic_rename = False

    @pytest.fixture
    def storage(self, s3_endpoint: str) -> Storage:
        s3fs = pytest.importorskip("s3fs")
        fs = s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
            skip_instance_cache=True,
        )
        return FsspecStorage(fs)

    @pytest.fixture
    def root(self, storage: Storage, s3_bucket: str) -> Iterator[str]:
        root = f"s3://{s3_bucket}/{uuid.uuid4().hex}"
        yield root
        storage.remove_tree(root)


@pytest.fixture
def storage() -> FsspecStorage:
    return FsspecStorage(fsspec.filesystem("memory"))


@pytest.fixture
def root(storage: FsspecStorage) -> Iterator[str]:
    root = f"memory://tp-{uuid.uuid4().hex}"
    storage.makedirs(root)
    yield root
    storage.remove_tree(root)


def test_url_path_helpers(storage: FsspecStorage) -> None:
    assert storage.join("s3://bucket", "a", "ckpt-1.index") == "s3://bucket/a/ckpt-1.index"
    assert storage.join("s3://bucket/", "a") == "s3://bucket/a"
    assert storage.dirname("s3://bucket/a/ckpt-1.index") == "s3://bucket/a"
    assert storage.dirname("s3://bucket/a") == "s3://bucket"
    assert storage.dirname("s3://bucket") == "s3://"
    assert storage.basename("s3://bucket/a/ckpt-1.index") == "ckpt-1.index"
    assert storage.basename("gs://bucket") == "bucket"


def test_from_url_unknown_scheme() -> None:
    with pytest.raises(InvalidArgumentError, match="fsspec cannot open nosuchproto://x"):
        FsspecStorage.from_url("nosuchproto://x")


def test_from_url_missing_plugin_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if s3fs were not installed: importing it fails, whatever the environment has.
    for name in [m for m in sys.modules if m == "s3fs" or m.startswith("s3fs.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "s3fs", None)
    with pytest.raises(CheckpointError, match="s3fs") as info:
        FsspecStorage.from_url("s3://bucket/ckpt")
    assert info.value.path == "s3://bucket/ckpt"


class _BrokenFile:
    def __init__(self, error: OSError) -> None:
        self._error = error

    def write(self, data: Any) -> int:
        raise self._error

    closed = False

    def tell(self) -> int:
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_write_errors_are_mapped(
    storage: FsspecStorage, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = OSError(errno.ENOSPC, "quota exhausted")
    monkeypatch.setattr(storage.fs, "open", lambda path, mode: _BrokenFile(error))
    path = storage.join(root, "data")
    with pytest.raises(
        CheckpointError, match=f"No space left on device while writing {path}"
    ) as info:
        storage.write_bytes(path, b"x")
    assert info.value.path == path
    assert info.value.__cause__ is error


def test_read_errors_are_mapped(
    storage: FsspecStorage, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = storage.join(root, "data")
    storage.write_bytes(path, b"0123456789")

    def denied(*args: object, **kwargs: object) -> bytes:
        raise PermissionError(errno.EACCES, "Access Denied")

    monkeypatch.setattr(storage.fs, "cat_file", denied)
    with (
        storage.open_range_reader(path) as reader,
        pytest.raises(CheckpointError, match=f"Permission denied while reading {path}"),
    ):
        reader.read(0, 4)


def test_missing_object_is_not_found(storage: FsspecStorage, root: str) -> None:
    path = storage.join(root, "missing.index")
    with pytest.raises(NotFoundError) as info:
        storage.open_range_reader(path)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert info.value.path == path


def test_buffered_object_file_commits_on_close() -> None:
    # s3fs/gcsfs files are AbstractBufferedFile uploads: nothing is visible before close().
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

    objects: dict[str, bytes] = {}

    class UploadFile(AbstractBufferedFile):
        def _initiate_upload(self) -> None:
            self.parts: list[bytes] = []

        def _upload_chunk(self, final: bool = False) -> bool:
            self.parts.append(self.buffer.getvalue())
            if final:
                objects[self.path] = b"".join(self.parts)
            return True

    class UploadFileSystem(AbstractFileSystem):
        protocol = "upload"

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> UploadFile:
            return UploadFile(self, path, mode, block_size=5 * 2**20)

    storage = FsspecStorage(UploadFileSystem())
    f = storage.open_write("upload://bucket/ckpt.data")
    f.write(b"head")
    f.write(b"x" * (6 << 20))  # crosses one upload part
    assert "bucket/ckpt.data" not in objects
    f.close()
    f.close()  # idempotent
    assert objects["bucket/ckpt.data"] == b"head" + b"x" * (6 << 20)
