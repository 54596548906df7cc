"""One Spark session with executors in processes of their own (master ``local-cluster[2,1,1024]``), serving the
cluster tests' jobs one after another, so a test run starts one cluster (tests/spark_cluster/cluster.py).

Usage: python -m tests.processes.spark_cluster (from the repository's root)

Prints ``{"ready": <executor count>}``, then reads one JSON request per line, ``{"job": NAME, "args": {...}}``,
runs the job of that name (tests/processes/cluster_jobs.py) and prints one JSON line: ``{"ok": result}`` or
``{"error": traceback}``. Ends at end of input.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from streaming import local_session
from tests.processes.cluster_jobs import JOBS


def main() -> int:
    spark = local_session("ledgerview-cluster-tests", master="local-cluster[2,1,1024]")
    executors = spark.sparkContext.parallelize(range(8), 8).map(lambda _: os.getpid()).distinct().count()
    print(json.dumps({"ready": executors}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": JOBS[request["job"]](spark, **request["args"])}
        except Exception:  # the test shows it; the cluster serves the next job
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
