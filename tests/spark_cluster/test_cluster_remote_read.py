"""Spark with executors in processes of their own (``local-cluster[2,1,1024]``) reads a topic from its remote
tier alone: the writer's data folder is moved away first, so every byte the executors read comes from object
storage (a real S3-protocol server on 127.0.0.1). The run's one cluster serves it (tests/spark_cluster/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactor import Compactor
from readers import Reader
from storage import Store
from storage.schema import Message
from tests.spark_cluster.cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TIERED = {"segment.bytes": "4096", "index.interval.bytes": "512", "remote.storage.enable": "true",
          "local.retention.ms": "0", "file.delete.delay.ms": "0"}


def write_tiered_topic(tmp_path: Path, s3_uri: str) -> None:
    """Topic "t" (2 partitions of small segments, compacted once, then 20 more messages) on the remote tier
    alone: the writer's folder is moved away, so nothing may read it."""
    folder = tmp_path / "data"
    with Store.open(folder, remote=s3_uri) as store:
        store.create_topic("t", 2, TIERED)
        store.append("t", [(f"k{i % 40}", f"v{i}".encode() * 5) for i in range(1_500)])
        store.append("t", [("k3", None), ("k4", None)])
        for partition in (0, 1):
            store.roll("t", partition)
        Compactor(store).compact("t")
        store.append("t", [(f"k{i % 40}", f"w{i}".encode() * 5) for i in range(20)])
        for partition in (0, 1):
            store.roll("t", partition)
        store.sync_remote()
    folder.rename(tmp_path / "moved-away")


def summary(messages: list[Message]) -> tuple[int, int, int]:
    """Rows, the sum of value lengths (a tombstone's counts 0), distinct keys."""
    return len(messages), sum(len(m.value or b"") for m in messages), len({m.key for m in messages})


def test_executors_read_the_raw_log_and_both_compacted_views_from_the_remote_tier(
        tmp_path: Path, s3_uri: str, spark_cluster: SparkCluster) -> None:
    write_tiered_topic(tmp_path, s3_uri)
    expected = {view: summary(list(Reader(s3_uri, "t", read_compacted=compacted)))
                for view, compacted in (("raw", False), ("read_compacted", True))}
    latest = {m.key: m.value for m in Reader(s3_uri, "t")}
    live = {key: value for key, value in latest.items() if value is not None}
    expected["compacted"] = (len(live), sum(len(value) for value in live.values()), len(live))
    result = spark_cluster.run("read_views", uri=s3_uri, topic="t")
    assert spark_cluster.executors == 2 and len(result["reader_pids"]) == 2
    for view, (rows, value_bytes, keys) in expected.items():
        assert (result[view]["rows"], result[view]["value_bytes"], result[view]["keys"]) == (rows, value_bytes, keys)
    assert result["raw"]["tasks"] > 2  # cut by segment ranges, not one task per log partition


def test_executors_stream_the_raw_log_and_the_compacted_view_from_the_remote_tier(
        tmp_path: Path, s3_uri: str, spark_cluster: SparkCluster) -> None:
    """readStream from earliest, availableNow. The compacted stream is not the table (one row per live key): it
    is the latest-per-key snapshot (the ledger), then every message above the horizon, older versions and
    tombstones included; so it is what a read_compacted Reader reads from earliest, in offset order."""
    write_tiered_topic(tmp_path, s3_uri)
    expected = {view: list(Reader(s3_uri, "t", read_compacted=compacted))
                for view, compacted in (("raw", False), ("compacted", True))}
    result = spark_cluster.run("stream_views", uri=s3_uri, topic="t")
    for view, messages in expected.items():
        batches = result[view]
        streamed = {p: sorted(o for batch in batches for o in batch["offsets"].get(p, [])) for p in ("0", "1")}
        assert streamed == {str(p): [m.offset for m in messages if m.partition == p] for p in (0, 1)}
        assert all(batch["ordered"] for batch in batches)
        keys = {key for batch in batches for key in batch["keys"]}
        assert (sum(b["rows"] for b in batches), sum(b["value_bytes"] for b in batches), len(keys)) == \
            summary(messages)
    table_rows = len({m.key: m for m in expected["raw"] if m.value is not None})  # no key ends deleted here
    assert table_rows < len(expected["compacted"]) < len(expected["raw"])  # neither the table nor the raw log
    for batch in result["raw"]:  # each log partition's share of a micro-batch is cut along its segments
        assert batch["tasks"] > 2 and min(batch["tasks_per_partition"].values()) > 1
