"""Spark with executors in processes of their own (``local-cluster[2,1,1024]``) reads a topic from its remote
tier alone: the writer's data folder is moved away first, so every byte the executors read comes from object
storage (a real S3-protocol server on 127.0.0.1). The run's one cluster serves it (tests/spark/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactor import Compactor
from readers import Reader
from storage import Store
from tests.spark.cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TIERED = {"segment.bytes": "4096", "index.interval.bytes": "512", "remote.storage.enable": "true",
          "local.retention.ms": "0", "file.delete.delay.ms": "0"}


def test_executors_read_the_raw_log_and_both_compacted_views_from_the_remote_tier(
        tmp_path: Path, s3_uri: str, spark_cluster: SparkCluster) -> None:
    folder = tmp_path / "data"
    with Store.open(folder, remote=s3_uri) as store:
        store.create_topic("t", 2, TIERED)
        store.append("t", [(f"k{i % 40}", f"v{i}".encode() * 5) for i in range(1_500)])
        store.append("t", [("k3", None), ("k4", None)])
        store.roll("t", 0), store.roll("t", 1)
        Compactor(store).compact("t")
        store.append("t", [(f"k{i % 40}", f"w{i}".encode() * 5) for i in range(20)])
        store.roll("t", 0), store.roll("t", 1)
        store.sync_remote()
    expected = {}
    for view, compacted in (("raw", False), ("read_compacted", True)):
        messages = list(Reader(s3_uri, "t", read_compacted=compacted))
        expected[view] = (len(messages), sum(len(m.value or b"") for m in messages),
                          len({m.key for m in messages}))
    latest = {m.key: m.value for m in Reader(s3_uri, "t")}
    live = {key: value for key, value in latest.items() if value is not None}
    expected["compacted"] = (len(live), sum(len(value) for value in live.values()), len(live))
    folder.rename(tmp_path / "moved-away")  # nothing may read the writer's folder now
    result = spark_cluster.run("read_views", uri=s3_uri, topic="t")
    assert spark_cluster.executors == 2 and len(result["reader_pids"]) == 2
    for view, (rows, value_bytes, keys) in expected.items():
        assert (result[view]["rows"], result[view]["value_bytes"], result[view]["keys"]) == (rows, value_bytes, keys)
    assert result["raw"]["tasks"] > 2  # cut by segment ranges, not one task per log partition
