"""Issue 27 finding 4: local reads open regular files only, and never block.

A FIFO where a checkpoint file is expected used to hang every reader (``open`` waits for a
writer); a directory, device or socket failed with errors that did not say what the path is.
Each call here runs under a deadline, so a hang fails the test instead of stalling the suite.
Symbolic links are followed as TensorFlow follows them; a dangling one is ``NotFoundError``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import DataLossError, NotFoundError
from trackpoint.storage import LocalStorage
from trackpoint.storage.lock import local_lock_holder, lock_local_directory


def _socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (os.mkfifo, "a FIFO (named pipe)"),
        (os.mkdir, "a directory"),
        (lambda p: os.symlink(os.path.basename(p), p), "a symbolic link loop"),
        (lambda p: os.symlink("/dev/null", p), "a character device"),
    ],
    ids=["fifo", "directory", "symlink-loop", "device"],
)
def test_only_regular_files_are_opened(
    tmp_path: Path, make: Callable[[str], object], kind: str, deadline
) -> None:
    path = str(tmp_path / "thing")
    make(path)
    storage = LocalStorage()
    for read in (storage.open_range_reader, storage.read_bytes):
        with deadline(), pytest.raises(DataLossError) as info:
            read(path)
        assert info.value.path == path
        assert f"{path} is {kind}, not a regular file" in str(info.value)
    assert storage.describe(path) == kind


def test_the_deadline_interrupts_a_blocking_open(tmp_path: Path, deadline) -> None:
    # What every test here relies on: a reader that blocks fails the test, not the suite.
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(deadline.Hang, match="open of a FIFO did not finish within 0.2 s"):
        with deadline(0.2, "open of a FIFO"):
            open(tmp_path / "fifo", "rb")  # blocks: no writer ever comes


def test_a_socket_is_refused(tmp_path: Path, deadline) -> None:
    path = tmp_path / "sock"
    with _socket(path), deadline(), pytest.raises(DataLossError, match="is a socket"):
        LocalStorage().read_bytes(str(path))


def test_a_fifo_url_keeps_the_callers_spelling(tmp_path: Path, deadline) -> None:
    os.mkfifo(tmp_path / "f")
    url = f"file://{tmp_path}/f"
    with deadline(), pytest.raises(DataLossError) as info:
        LocalStorage().open_range_reader(url)
    assert info.value.path == url and "a FIFO" in str(info.value)


def test_symlinks_are_followed_and_a_dangling_one_is_not_found(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "real").write_bytes(b"payload")
    (tmp_path / "link").symlink_to(outside / "real")
    storage = LocalStorage()
    assert storage.read_bytes(str(tmp_path / "link")) == b"payload"  # as TensorFlow does
    assert storage.describe(str(tmp_path / "link")) == "a regular file"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(NotFoundError, match="dangling symbolic link") as info:
        storage.read_bytes(str(tmp_path / "dangling"))
    assert isinstance(info.value, FileNotFoundError)
    assert storage.describe(str(tmp_path / "dangling")) == "a dangling symbolic link"
    assert storage.describe(str(tmp_path / "missing")) == "a missing path"


def test_a_fifo_data_file_fails_the_reader_instead_of_hanging(tmp_path: Path, deadline) -> None:
    prefix = tp.Checkpoint(model={"w": np.arange(3.0)}).write(str(tmp_path / "ckpt"))
    data = Path(prefix + ".data-00000-of-00001")
    data.unlink()
    os.mkfifo(data)
    reader = tp.load_checkpoint(prefix)
    with deadline(), pytest.raises(DataLossError, match="FIFO"):
        reader.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE")
    live = {"w": np.zeros(3)}
    with deadline(), pytest.raises(DataLossError, match="not a regular file"):
        tp.Checkpoint(model=live).read(prefix)
    assert not live["w"].any()


def test_a_fifo_index_or_state_file_fails_instead_of_hanging(tmp_path: Path, deadline) -> None:
    prefix = tp.Checkpoint(model={"w": np.arange(3.0)}).save(str(tmp_path / "ckpt"))
    Path(prefix + ".index").unlink()
    os.mkfifo(prefix + ".index")
    with deadline(), pytest.raises(DataLossError, match="FIFO"):
        tp.list_variables(prefix)
    state = tmp_path / "checkpoint"
    state.unlink()
    os.mkfifo(state)
    with deadline(), pytest.raises(DataLossError, match="FIFO"):
        tp.get_checkpoint_state(str(tmp_path))


def test_a_fifo_lock_file_neither_hangs_the_probe_nor_the_writer(tmp_path: Path, deadline) -> None:
    os.mkfifo(tmp_path / ".trackpoint.lock")
    with deadline():
        assert local_lock_holder(str(tmp_path)) is None
    with deadline(), pytest.raises(DataLossError, match="FIFO"):
        lock_local_directory(str(tmp_path))


def test_link_copy_fallback_refuses_a_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deadline
) -> None:
    import errno

    os.mkfifo(tmp_path / "src")

    def no_link(src: str, dst: str) -> None:
        raise OSError(errno.EXDEV, "cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    with deadline(), pytest.raises(DataLossError, match="FIFO"):
        LocalStorage().link(str(tmp_path / "src"), str(tmp_path / "dst"))
