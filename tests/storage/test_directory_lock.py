"""Storage.lock_directory: one writer per directory (flock, in-memory lock, object-store lease).

The local lock is checked against a real second process; the lease against records written as
another host or a dead process would have left them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trackpoint.errors import CheckpointError, FailedPreconditionError
from trackpoint.storage import (
    DirectoryLock,
    FsspecStorage,
    LocalStorage,
    LockHolder,
    MemoryStorage,
)
from trackpoint.storage.lease import lease_holder, lock_with_lease
from trackpoint.storage.lock import LOCK_FILENAME

_HOLD = """
import sys, time
from trackpoint.storage import LocalStorage
lock = LocalStorage().lock_directory(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder_process(
    tmp_path: Path, background_process: Callable[..., subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    """A second process holding the lock of ``tmp_path / "dir"`` until killed."""
    return background_process(_HOLD, str(tmp_path / "dir"), ready="locked")


# -- local disks -------------------------------------------------------------------------------


def test_second_process_fails_fast_naming_the_holder_then_takes_over_after_sigkill(
    tmp_path: Path,
    holder_process: subprocess.Popen[str],
    pid_seen_by_another_process: Callable[[Path], int],
) -> None:
    directory = tmp_path / "dir"
    storage = LocalStorage()
    holder = storage.lock_holder(str(directory))
    assert holder is not None
    assert (holder.pid, holder.host) == (holder_process.pid, socket.gethostname())
    with pytest.raises(FailedPreconditionError) as info:
        storage.lock_directory(str(directory))
    message = str(info.value)
    assert f"process {holder_process.pid} on host {socket.gethostname()}" in message
    assert str(directory) in message and LOCK_FILENAME in message
    assert info.value.path == str(directory)

    holder_process.send_signal(signal.SIGKILL)
    holder_process.wait()
    # The kernel released the dead process's lock: no cleanup, the stale file is reused.
    assert (directory / LOCK_FILENAME).exists()
    assert storage.lock_holder(str(directory)) is None
    with storage.lock_directory(str(directory)) as lock:
        recorded = json.loads((directory / LOCK_FILENAME).read_text())
        assert recorded["pid"] == os.getpid() == lock.holder.pid
        assert lock.exclusive
        assert pid_seen_by_another_process(directory) == os.getpid()
    assert not (directory / LOCK_FILENAME).exists()  # removed on release
    assert pid_seen_by_another_process(directory) == 0


def test_handles_of_one_process_share_the_lock_until_the_last_is_released(
    tmp_path: Path,
) -> None:
    storage = LocalStorage()
    first = storage.lock_directory(str(tmp_path / "new" / "dir"))  # created on demand
    second = LocalStorage().lock_directory(f"file://{tmp_path}/new/dir")
    assert second.key == first.key
    assert storage.lock_holder(str(tmp_path / "new" / "dir")) is None  # ours, not another's
    first.release()
    first.release()  # idempotent
    assert first.released and not second.released
    with pytest.raises(FailedPreconditionError, match="released"):
        first.check()
    second.check()
    assert (tmp_path / "new" / "dir" / LOCK_FILENAME).exists()
    copied = copy.deepcopy(second)  # a copied owner holds its own handle
    second.release()
    assert (tmp_path / "new" / "dir" / LOCK_FILENAME).exists()
    copied.release()
    assert not (tmp_path / "new" / "dir" / LOCK_FILENAME).exists()


def test_a_garbage_collected_handle_releases_the_lock(tmp_path: Path) -> None:
    lock = LocalStorage().lock_directory(str(tmp_path))
    del lock
    assert not (tmp_path / LOCK_FILENAME).exists()


def test_a_deleted_lock_file_is_reported_by_check(tmp_path: Path) -> None:
    with LocalStorage().lock_directory(str(tmp_path)) as lock:
        lock.check()
        (tmp_path / LOCK_FILENAME).unlink()
        with pytest.raises(FailedPreconditionError, match="deleted or replaced"):
            lock.check()


_FORK_CHILD = """
import os, sys
from trackpoint.errors import FailedPreconditionError
from trackpoint.storage import LocalStorage
path = sys.argv[1]
lock = LocalStorage().lock_directory(path)
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its inherited handle is void, the parent still holds the lock
    code = 1
    try:
        try:
            LocalStorage().lock_directory(path)
        except FailedPreconditionError as exc:
            code = 0 if f"process {os.getppid()} " in str(exc) and lock.released else 2
    finally:
        os.write(write, bytes([code]))
        os._exit(0)
os.waitpid(pid, 0)
assert os.read(read, 1) == b"\\x00", "the child could take the lock or misread it"
assert not lock.released
lock.release()
print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_holds_nothing_and_leaves_the_parents_lock(tmp_path: Path) -> None:
    # In a fresh interpreter: forking this test process, whose other tests started JAX's
    # threads, could deadlock the child.
    done = subprocess.run(
        [sys.executable, "-c", _FORK_CHILD, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert not (tmp_path / LOCK_FILENAME).exists()  # released by the parent at its end


def test_lock_errors_are_checkpoint_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError):
        LocalStorage().lock_directory(str(blocker / "sub"))


# -- memory (the test double) ------------------------------------------------------------------


def test_memory_storage_lock_is_shared_in_process_and_can_pretend_another_holder() -> None:
    storage = MemoryStorage()
    first = storage.lock_directory("run")
    assert storage.exists("run")
    with storage.lock_directory("run") as second:
        assert second.key == first.key
    first.release()
    other = LockHolder("elsewhere", 4242, time.time())
    storage.set_lock_holder("run", other)
    assert storage.lock_holder("run") == other
    with pytest.raises(FailedPreconditionError, match="process 4242 on host elsewhere"):
        storage.lock_directory("run")
    storage.set_lock_holder("run", None)
    storage.lock_directory("run").release()
    seen: list[str] = []
    storage.set_fault_hook(lambda operation, path: seen.append(operation))
    storage.lock_directory("run").release()
    assert "lock_directory" in seen


# -- object stores: the best-effort lease ------------------------------------------------------


@pytest.fixture
def fs_storage() -> FsspecStorage:
    fsspec = pytest.importorskip("fsspec")
    return FsspecStorage(fsspec.filesystem("memory"))


@pytest.fixture
def url(fs_storage: FsspecStorage) -> Iterator[str]:
    root = f"memory://tp-lock-{uuid.uuid4().hex}"
    yield root
    fs_storage.remove_tree(root)


def _write_lease(storage: FsspecStorage, url: str, host: str, pid: int, expires: float) -> None:
    record = {
        "host": host,
        "pid": pid,
        "started": time.time(),
        "token": "theirs",
        "expires": expires,
    }
    storage.makedirs(url)
    storage.write_bytes(f"{url}/{LOCK_FILENAME}", json.dumps(record).encode())


def test_lease_is_recorded_shared_in_process_and_removed_on_release(
    fs_storage: FsspecStorage, url: str
) -> None:
    lock = fs_storage.lock_directory(url)
    assert not lock.exclusive
    record = json.loads(fs_storage.read_bytes(f"{url}/{LOCK_FILENAME}"))
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert record["expires"] > time.time()
    assert fs_storage.lock_holder(url) is None  # held by this process
    again = FsspecStorage(fs_storage.fs).lock_directory(url)
    assert again.key == lock.key
    lock.release()
    assert fs_storage.exists(f"{url}/{LOCK_FILENAME}")
    again.release()
    assert not fs_storage.exists(f"{url}/{LOCK_FILENAME}")


def test_a_live_lease_of_another_host_is_refused_and_an_expired_one_taken_over(
    fs_storage: FsspecStorage, url: str
) -> None:
    _write_lease(fs_storage, url, "elsewhere", 99, time.time() + 60)
    holder = fs_storage.lock_holder(url)
    assert holder is not None and (holder.host, holder.pid) == ("elsewhere", 99)
    with pytest.raises(FailedPreconditionError, match=r"process 99 on host elsewhere.*expires"):
        fs_storage.lock_directory(url)
    _write_lease(fs_storage, url, "elsewhere", 99, time.time() - 1)
    assert fs_storage.lock_holder(url) is None
    with fs_storage.lock_directory(url) as lock:
        assert lock.holder.pid == os.getpid()


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
    fs_storage: FsspecStorage, url: str
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lease(fs_storage, url, socket.gethostname(), dead.pid, time.time() + 60)
    assert fs_storage.lock_holder(url) is None
    fs_storage.lock_directory(url).release()


def _lost(lock: DirectoryLock) -> bool:
    try:
        lock.check()
    except FailedPreconditionError:
        return True
    return False


def test_a_lease_is_renewed_and_its_loss_is_reported(fs_storage: FsspecStorage, url: str) -> None:
    lock = lock_with_lease(fs_storage, url, ttl=0.3)
    first = json.loads(fs_storage.read_bytes(f"{url}/{LOCK_FILENAME}"))["expires"]
    deadline = time.monotonic() + 10
    while json.loads(fs_storage.read_bytes(f"{url}/{LOCK_FILENAME}"))["expires"] == first:
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    lock.check()
    _write_lease(fs_storage, url, "elsewhere", 7, time.time() + 60)  # another writer took it
    deadline = time.monotonic() + 10
    while not _lost(lock):
        assert time.monotonic() < deadline, "the lost lease was never noticed"
        time.sleep(0.05)
    with pytest.raises(FailedPreconditionError, match=r"lost its lease.*process 7 on host elsewh"):
        lock.check()
    lock.release()
    assert lease_holder(fs_storage, url) is not None  # the other writer's lease is left alone
