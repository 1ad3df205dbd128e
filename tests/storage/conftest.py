"""Fixtures for storage tests: an S3-compatible server (moto) for the fsspec backend."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

_S3_BUCKET = "trackpoint-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1 holding the empty bucket ``s3_bucket``.

    Skips unless s3fs (fsspec's S3 plugin, the only way fsspec reaches S3) is installed.
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
