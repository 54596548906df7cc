"""A real S3-protocol server for the tests: moto's server mode on 127.0.0.1, started once per test run, spoken to
over HTTP by pyarrow's and boto3's own S3 clients. Each test gets a bucket of its own."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

_buckets = itertools.count()


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def new_bucket(self) -> str:
        import boto3

        name = f"ledgerview-test-{next(_buckets)}"
        boto3.client("s3").create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {name: os.environ.get(name) for name in
             ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="ledgerview", AWS_SECRET_ACCESS_KEY="ledgerview",
                      AWS_REGION="us-east-1")
    try:
        yield S3Server(endpoint)
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def s3_uri(s3_server: S3Server) -> str:
    """A fresh, empty remote tier: ``s3://<new bucket>/tier``."""
    return f"s3://{s3_server.new_bucket()}/tier"
