"""CheckpointLocation and locate(): the (storage, prefix) value decided once at the API edge."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from trackpoint.storage import CheckpointLocation, LocalStorage, MemoryStorage, locate
from trackpoint.storage.fsspec import FsspecStorage
from trackpoint.storage.url import local_path, split_scheme


def test_locate_keeps_a_given_storage() -> None:
    storage = MemoryStorage()
    location = locate("s3://bucket/ckpt-1", storage=storage)
    assert location == CheckpointLocation(storage, "s3://bucket/ckpt-1")
    assert location.storage is storage


@pytest.mark.parametrize("fsync", [True, False])
def test_locate_picks_local_storage_for_paths_and_file_urls(tmp_path: Path, fsync: bool) -> None:
    for path in (str(tmp_path / "ckpt-1"), f"file://{tmp_path}/ckpt-1"):
        location = locate(path, fsync=fsync)
        assert isinstance(location.storage, LocalStorage)
        assert location.storage.fsync is fsync
        assert location.prefix == path


def test_locate_picks_fsspec_for_urls() -> None:
    pytest.importorskip("fsspec")
    prefix = f"memory://tp-{uuid.uuid4().hex}/ckpt-1"
    location = locate(prefix)
    assert isinstance(location.storage, FsspecStorage)
    location.storage.write_bytes(location.prefix + ".index", b"x")
    assert locate(prefix).storage.read_bytes(prefix + ".index") == b"x"
    location.storage.remove_tree(location.storage.dirname(prefix))


def test_location_is_frozen_and_slotted() -> None:
    location = locate("ckpt", storage=MemoryStorage())
    with pytest.raises(dataclasses.FrozenInstanceError):
        location.prefix = "other"  # type: ignore[misc]
    assert not hasattr(location, "__dict__")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("s3://b/k", ("s3://", "b/k")),
        ("simplecache::s3://b/k", ("simplecache::s3://", "b/k")),
        ("/tmp/k", ("", "/tmp/k")),
    ],
)
def test_split_scheme(path: str, expected: tuple[str, str]) -> None:
    assert split_scheme(path) == expected


def test_local_path_strips_only_the_file_scheme() -> None:
    assert local_path("file:///tmp/ckpt") == "/tmp/ckpt"
    assert local_path("/tmp/ckpt") == "/tmp/ckpt"
    assert local_path("s3://b/k") == "s3://b/k"


def test_file_url_reads_through_local_storage(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    location = locate(f"file://{tmp_path}/f")
    assert location.storage.read_bytes(location.prefix) == b"abc"
