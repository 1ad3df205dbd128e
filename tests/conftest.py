"""Shared fixtures.

``corrupt(prefix, key)`` flips one byte of a stored value, whose crc32c then fails.
``s3_endpoint``/``s3_bucket`` start a real S3-compatible server (moto) on loopback, once per
session, for the fsspec storage and distributed tests. ``tf`` gives real TensorFlow for
interoperability tests. Under ``make test`` (which sets
TRACKPOINT_REQUIRE_TENSORFLOW=1) a missing TensorFlow is an error, not a skip, so interop can
never silently stop being tested.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
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
