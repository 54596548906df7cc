"""The one ``local-cluster`` Spark of a test run: a child process (a process has one SparkContext, and the test
process may hold the run's local Spark session) that runs the cluster tests' jobs (tests/processes/cluster_jobs.py)
on executors in processes of their own. It starts after the S3 server, so it and its executors reach the server
through the AWS variables."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.processes.children import SCRIPTS
from tests.s3_server import S3Server

JOB_DEADLINE_S = 600.0
"""How long a test waits for one job's answer: a guard against hangs, not a timing."""


class SparkCluster:
    def __init__(self) -> None:
        root = str(SCRIPTS.parent.parent)  # the jobs' module is importable in the child and its executors
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "tests.processes.spark_cluster"], cwd=root,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": path})
        self.executors = self._reply()["ready"]

    def _reply(self) -> dict[str, Any]:
        """The child's next JSON line (lines Spark itself may print are passed over)."""
        assert self.process.stdout is not None
        while True:
            ready, _, _ = select.select([self.process.stdout], [], [], JOB_DEADLINE_S)
            line = self.process.stdout.readline() if ready else ""
            assert line, f"the local-cluster child answered nothing (exit code {self.process.poll()})"
            if line.startswith("{"):
                reply: dict[str, Any] = json.loads(line)
                return reply

    def run(self, job: str, **args: Any) -> Any:
        """Run ``job`` on the cluster; its result, or AssertionError with the job's traceback."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"job": job, "args": args}) + "\n")
        self.process.stdin.flush()
        reply = self._reply()
        assert "error" not in reply, reply["error"]
        return reply["ok"]

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()


@pytest.fixture(scope="session")
def spark_cluster(s3_server: S3Server) -> Iterator[SparkCluster]:
    cluster = SparkCluster()
    yield cluster
    cluster.stop()
