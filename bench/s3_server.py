"""An S3-protocol server for the remote tier's workloads: moto's server mode, in a process of its own on a free
port of 127.0.0.1, so that serving (Python, under its own GIL) never competes with the job for the job's GIL, and
the job's memory is its own. ``python -m bench.s3_server`` serves until its standard input closes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench.measurement import cpu_seconds

AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
LISTENING = "listening on "


@dataclass(frozen=True)
class S3Server:
    uri: str
    """``s3://<a fresh bucket>/tier``."""
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has spent so far."""
        return cpu_seconds(self.pid)


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A fresh server with a fresh bucket. Meanwhile the AWS variables point this process's pyarrow and boto3 at
    it; at the end it stops (its objects go with it) and the variables are put back."""
    import boto3

    process = subprocess.Popen([sys.executable, "-m", "bench.s3_server"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    saved = {name: os.environ.get(name) for name in AWS_VARIABLES}
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith(LISTENING):
            raise RuntimeError(f"the S3 server did not start: {line!r}")
        os.environ.update(AWS_ENDPOINT_URL=line.removeprefix(LISTENING).strip(), AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
        bucket = f"ledgerview-bench-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        yield S3Server(f"s3://{bucket}/tier", process.pid)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if process.stdin is not None:
            process.stdin.close()  # the server's signal to stop
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def serve() -> None:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"{LISTENING}http://{host}:{port}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    serve()
