"""resolve_location: the path resolver returns the prefix with its storage, picked once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
import trackpoint.storage.location as location_module
from trackpoint.errors import NotFoundError
from trackpoint.management.paths import resolve_location, resolve_prefix
from trackpoint.storage import CheckpointLocation, FsspecStorage, MemoryStorage, Storage

KEY = "w/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture
def memory_dir() -> Iterator[str]:
    """A memory:// directory with two saves; its state file names ``ckpt-2``."""
    pytest.importorskip("fsspec")
    root = f"memory://tp-resolve-{uuid.uuid4().hex}"
    ckpt = tp.Checkpoint(w=np.ones(1))
    ckpt.save(f"{root}/ckpt")
    ckpt.save(f"{root}/ckpt")
    yield root
    tp.storage.locate(root).storage.remove_tree(root)


@pytest.fixture
def picks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path a backend is picked for, from now on."""
    seen: list[str] = []
    real = location_module.storage_for

    def counting(path: str, *, fsync: bool = True) -> Storage:
        seen.append(path)
        return real(path, fsync=fsync)

    monkeypatch.setattr(location_module, "storage_for", counting)
    return seen


@pytest.mark.parametrize("form", ["", "/ckpt-2", "/ckpt-2.index", "/ckpt-2.data-00000-of-00001"])
def test_every_form_of_a_url_is_resolved_with_one_backend_pick(
    memory_dir: str, picks: list[str], form: str
) -> None:
    location = resolve_location(memory_dir + form)
    assert location.prefix == f"{memory_dir}/ckpt-2"
    assert picks == [memory_dir + form]  # once, for every look-up of the directory and state file
    assert location.storage.exists(location.prefix + ".index")
    assert resolve_prefix(memory_dir + form) == location.prefix


def test_a_given_storage_is_kept_and_nothing_is_picked(picks: list[str]) -> None:
    storage = MemoryStorage()
    storage.makedirs("run")
    storage.write_bytes("run/ckpt-1.index", b"")
    location = resolve_location("run/ckpt-1.index", storage=storage)
    assert location == CheckpointLocation(storage, "run/ckpt-1")
    assert picks == []


def test_load_checkpoint_reads_through_the_resolved_storage(memory_dir: str) -> None:
    with tp.load_checkpoint(memory_dir) as reader:
        assert reader.prefix == f"{memory_dir}/ckpt-2"
        assert reader.get_tensor(KEY).tolist() == [1.0]


def test_a_missing_url_checkpoint_is_not_found(memory_dir: str) -> None:
    with pytest.raises(NotFoundError, match="ckpt-9"):
        resolve_location(f"{memory_dir}/ckpt-9")


def test_a_manager_picks_its_directory_backend_once(memory_dir: str, picks: list[str]) -> None:
    # The lock, the state file and the checkpoints it lists: one backend, picked at creation.
    manager = tp.CheckpointManager(tp.Checkpoint(w=np.ones(1)), memory_dir, max_to_keep=1)
    try:
        assert manager.latest_checkpoint == f"{memory_dir}/ckpt-2"
        assert picks == [memory_dir]
    finally:
        manager.close()


@pytest.fixture
def url_picks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL an fsspec backend is built for, from now on, whichever module asks."""
    seen: list[str] = []
    real = FsspecStorage.from_url.__func__  # type: ignore[attr-defined]

    def counting(cls: type[FsspecStorage], /, url: str, **kwargs: Any) -> FsspecStorage:
        seen.append(url)
        return real(cls, url, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(FsspecStorage, "from_url", classmethod(counting))
    return seen


def test_checkpoint_save_write_and_restore_on_a_url_pick_the_backend_once(
    memory_dir: str, url_picks: list[str]
) -> None:
    # The lock, the replace check, the saver and the state file: one backend, picked by save.
    ckpt = tp.Checkpoint(w=np.full(2, 5.0))
    saved = ckpt.save(f"{memory_dir}/other")
    assert url_picks == [f"{memory_dir}/other-1"]
    url_picks.clear()
    ckpt.write(f"{memory_dir}/plain")
    assert url_picks == [f"{memory_dir}/plain"]
    url_picks.clear()
    # The resolver, the reader, the restore engine and the incremental baseline: one pick.
    w = np.zeros(2)
    tp.Checkpoint(w=w).restore(saved).assert_consumed()
    assert url_picks == [saved]
    assert w.tolist() == [5.0, 5.0]
    assert tp.latest_checkpoint(memory_dir) == saved


def test_jax_restore_or_initialize_reads_through_the_managers_backend(
    memory_dir: str, url_picks: list[str]
) -> None:
    tpj = pytest.importorskip("trackpoint.integrations.jax")
    ckpt = tp.Checkpoint(w=np.zeros(1))  # a numpy leaf: float64, as saved
    manager = tp.CheckpointManager(ckpt, memory_dir, max_to_keep=3)
    try:
        url_picks.clear()
        state, path = tpj.restore_or_initialize(manager)
        assert path == f"{memory_dir}/ckpt-2"
        assert url_picks == []  # the manager's own backend, picked when it was created
        assert np.asarray(state["w"]).tolist() == [1.0]
    finally:
        manager.close()
