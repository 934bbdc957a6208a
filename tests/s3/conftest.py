"""moto's S3 server on 127.0.0.1 (one per session), a fresh bucket per test, and a per-test spool."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    # botocore (under s3fs) reads the endpoint from AWS_ENDPOINT_URL; so do child processes.
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture()
def bucket(s3_endpoint, tmp_path, monkeypatch):
    """``s3://<fresh bucket>``; this test's spool and read cache under tmp_path."""
    import fsspec

    monkeypatch.setenv("TRACERL_SPOOL", str(tmp_path / "spool"))
    name = f"tracerl-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(name)
    yield f"s3://{name}"
    import sdk

    sdk.shutdown()
