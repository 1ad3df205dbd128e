"""storage_for: choosing the backend from a path's syntax."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import trackpoint.storage
from trackpoint.storage import FsspecStorage, LocalStorage, is_url, storage_for


def test_exported_names() -> None:
    assert sorted(trackpoint.storage.__all__) == [
        "CheckpointLocation",
        "DirectoryLock",
        "FsspecStorage",
        "LocalStorage",
        "LockHolder",
        "MemoryStorage",
        "RangeReader",
        "Storage",
        "is_url",
        "locate",
        "storage_for",
    ]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/tmp/ckpt", False),
        ("relative/ckpt-1", False),
        ("file:///tmp/ckpt", False),
        ("s3://bucket/ckpt", True),
        ("gs://bucket", True),
        ("memory://x", True),
        ("simplecache::s3://bucket/ckpt", True),  # fsspec's chained URL
        ("filecache::memory://x", True),
        ("simplecache::file:///tmp/ckpt", True),  # the chain is fsspec's, not a local path
        ("file://relative/ckpt", False),
        ("C:\\ckpt\\ckpt-1", False),  # Windows drive, not a scheme
        ("C://ckpt", False),  # one letter: a drive to fsspec and Windows alike
        ("dir/a::b", False),  # "::" inside a local name is no chain
        ("/tmp/x://y", False),  # "://" inside a local path is no scheme
        ("", False),
    ],
)
def test_is_url(path: str, expected: bool) -> None:
    assert is_url(path) is expected


@pytest.mark.parametrize("fsync", [True, False])
def test_local_paths_get_local_storage(tmp_path: Path, fsync: bool) -> None:
    for path in (str(tmp_path), f"file://{tmp_path}", "relative/dir"):
        storage = storage_for(path, fsync=fsync)
        assert isinstance(storage, LocalStorage)
        assert storage.fsync is fsync
        assert storage.supports_atomic_rename


def test_local_name_with_colons_is_local(tmp_path: Path) -> None:
    # "::" inside a local path is no fsspec chain: the storage and the state file agree.
    path = str(tmp_path / "a::b" / "f")
    storage = storage_for(path)
    assert isinstance(storage, LocalStorage)
    storage.makedirs(storage.dirname(path))
    storage.write_bytes(path, b"x")
    assert (tmp_path / "a::b" / "f").read_bytes() == b"x"


def test_urls_get_fsspec_storage() -> None:
    pytest.importorskip("fsspec")
    root = f"memory://tp-{uuid.uuid4().hex}"
    storage = storage_for(root, fsync=False)
    assert isinstance(storage, FsspecStorage)
    assert storage.fsync is False
    assert not storage.supports_atomic_rename
    storage.makedirs(root)
    path = storage.join(root, "ckpt-1.index")
    storage.write_bytes(path, b"index")
    # A second lookup reaches the same filesystem.
    assert storage_for(path).read_bytes(path) == b"index"
    storage.remove_tree(root)


def test_import_does_not_load_fsspec() -> None:
    code = "import sys, trackpoint.storage; print('fsspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
