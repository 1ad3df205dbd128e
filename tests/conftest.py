"""Shared fixtures.

``corrupt(prefix, key)`` flips one byte of a stored value, whose crc32c then fails.
``with deadline(seconds, what):`` turns a call that hangs (a FIFO opened for reading) into a
failure, ``deadline.Hang``. ``background_process(code, *argv, ready=line)`` runs Python code
in a second process (a writer holding a directory) until the test ends;
``pid_seen_by_another_process(directory)`` asks a third one who holds a directory's lock.
``s3_endpoint``/``s3_bucket`` start a real S3-compatible server (moto) on loopback, once per
session, for the fsspec storage and distributed tests. ``tf`` gives real TensorFlow for
interoperability tests. Under ``make test`` (which sets
TRACKPOINT_REQUIRE_TENSORFLOW=1) a missing TensorFlow is an error, not a skip, so interop can
never silently stop being tested.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _require(module: str):  # noqa: ANN202
    if os.environ.get("TRACKPOINT_REQUIRE_TENSORFLOW") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def tf():  # noqa: ANN201
    """The real ``tensorflow`` module (test-only dependency)."""
    module = _require("tensorflow")
    module.get_logger().setLevel("ERROR")
    return module


_S3_BUCKET = "trackpoint-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1 holding the empty bucket ``s3_bucket``.

    Needs s3fs (fsspec's S3 plugin, the only way fsspec reaches S3) and moto, both in the dev
    extra.
    """
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=_S3_BUCKET)
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint: str) -> str:
    """Name of the bucket created on the ``s3_endpoint`` server."""
    return _S3_BUCKET


def _corrupt(prefix: str, key: str) -> None:
    from trackpoint.management.reader import CheckpointReader

    with CheckpointReader(prefix) as reader:
        entry = reader.bundle.entry(key)
        shards = reader.bundle.num_shards
    data = Path(f"{prefix}.data-{entry.shard_id:05d}-of-{shards:05d}")
    raw = bytearray(data.read_bytes())
    raw[entry.offset + entry.size // 2] ^= 0xFF
    data.write_bytes(bytes(raw))


@pytest.fixture(scope="session")  # a pure function: safe in hypothesis tests
def corrupt() -> Callable[[str, str], None]:
    """Flip one byte in the middle of ``key``'s stored value at ``prefix``."""
    return _corrupt


class Hang(BaseException):  # noqa: N818 - not an Exception: nothing under test may catch it
    """A call did not return before its deadline."""


class Deadline:
    """``with deadline(seconds, what):`` raises :class:`Hang` (``deadline.Hang``) in the main
    thread after ``seconds``; a blocking ``open`` of a FIFO is interrupted by the signal
    (PEP 475: the handler's exception ends the call). Main thread only (SIGALRM)."""

    Hang = Hang

    @contextmanager
    def __call__(self, seconds: float = 20.0, what: str = "the call") -> Iterator[None]:
        def expire(signum: int, frame: object) -> None:
            raise Hang(f"{what} did not finish within {seconds} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")  # stateless: safe in hypothesis tests
def deadline() -> Deadline:
    """Turns a hang into a failure: see :class:`Deadline`."""
    return Deadline()


@pytest.fixture
def background_process() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``background_process(code, *argv, ready=line)``: ``python -c code *argv`` in another
    process, returned once it printed the line ``ready``; killed when the test ends (a test may
    kill it sooner)."""
    children: list[subprocess.Popen[str]] = []

    def start(code: str, *argv: str, ready: str) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line == ready, f"the background process printed {line!r} instead of {ready!r}"
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


_LOCK_PROBE = """
import sys
from trackpoint.storage import LocalStorage
holder = LocalStorage().lock_holder(sys.argv[1])
print(holder.pid if holder else 0)
"""


def _pid_seen_by_another_process(directory: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _LOCK_PROBE, str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return int(out.stdout)


@pytest.fixture(scope="session")  # a pure function
def pid_seen_by_another_process() -> Callable[[Path], int]:
    """The pid of the process holding the writer lock of a local ``directory``, as a fresh
    process sees it (``LocalStorage().lock_holder``); 0 when no live process holds it."""
    return _pid_seen_by_another_process
