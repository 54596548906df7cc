"""The Spark sink to a topic on an object store alone (``option("path", "s3://…")``, streaming/remote_sink.py),
against a real S3-protocol server on 127.0.0.1.

- With executors in processes of their own (the run's local-cluster Spark, tests/spark_cluster/cluster.py): a streaming
  query and a ``df.write`` land every row exactly, in order, at contiguous offsets; the tasks upload segments and
  open no Store but their scratch folders; the driver's commit only reads and creates manifests (no segment object
  is read or written there, no Store opened), and its commit messages are a few hundred bytes per segment.
- Exactly once across ``kill -9`` of the driver (a query in a process of its own on ``local[2]``, restarted from
  its checkpoint): before the commit (the tasks have uploaded), between the partitions' publishes, and after the
  last publish but before Spark's commit log.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from readers import Reader
from storage.object_store import open_object_store
from storage.partitioner import partition_for_keys
from storage.remote_log import RemoteLog
from storage.remote_store import RemoteStore, RemoteTopicExistsError
from tests.processes.children import Child, assert_killed_at
from tests.spark.inputs import numbered_rows, write_input_files
from tests.spark_cluster.cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3
SMALL_SEGMENTS = {"segment.bytes": "16384", "index.interval.bytes": "1024"}
"""Task outputs are cut into several segments, each with index entries."""
Stored = dict[int, list[tuple[int, str, str, int]]]


def input_rows(count: int, start: int = 0) -> pa.Table:
    """Numbered rows (key k<i % 50>, value n<i> padded with dots to 100 bytes, timestamp 1.7e12 + i), as
    cluster_sink_jobs.sink_batch makes them in Spark."""
    rows = numbered_rows(count, start=start)
    values = [value.ljust(100, ".") for value in rows.column("value").to_pylist()]
    return rows.set_column(1, "value", pa.array(values)).append_column(
        "timestamp", pa.array(range(1_700_000_000_000 + start, 1_700_000_000_000 + start + count), pa.int64()))


def expected(rows: pa.Table) -> Stored:
    """Per log partition: the rows murmur2 sends there, in input order, at offsets from 0."""
    targets = partition_for_keys(rows.column("key").cast(pa.binary()), PARTITIONS)
    per: Stored = defaultdict(list)
    for target, key, value, timestamp in zip(targets.tolist(), *(rows.column(name).to_pylist()
                                             for name in ("key", "value", "timestamp")), strict=True):
        per[target].append((len(per[target]), key, value, timestamp))
    return dict(per)


def stored(uri: str, topic: str) -> Stored:
    per: Stored = defaultdict(list)
    for message in Reader(uri, topic):
        assert message.key is not None and message.value is not None
        per[message.partition].append((message.offset, message.key.decode(), message.value.decode(),
                                       message.timestamp))
    return dict(per)


def probe_records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(folder.iterdir())]


def test_a_stream_and_a_batch_write_from_executors_land_exactly_with_rows_never_at_the_driver(
        tmp_path: Path, s3_uri: str, spark_cluster: SparkCluster) -> None:
    remote = RemoteStore.open(s3_uri)
    for topic in ("streamed", "written"):
        remote.create_topic(topic, PARTITIONS, SMALL_SEGMENTS)
    streamed, written = input_rows(3_000), input_rows(4_000)
    source = write_input_files(tmp_path / "input", streamed, 3)
    stream_probe, batch_probe = tmp_path / "stream-probe", tmp_path / "batch-probe"
    for probe in (stream_probe, batch_probe):
        probe.mkdir()

    spark_cluster.run("sink_stream", uri=s3_uri, topic="streamed", source=str(source),
                      checkpoint=str(tmp_path / "checkpoint"), probe=str(stream_probe))
    spark_cluster.run("sink_batch", uri=s3_uri, topic="written", rows=4_000, tasks=4, probe=str(batch_probe))

    assert stored(s3_uri, "streamed") == expected(streamed)
    assert stored(s3_uri, "written") == expected(written)
    for topic, probe, batches in (("streamed", stream_probe, 3), ("written", batch_probe, 1)):
        records = probe_records(probe)
        writes = [record for record in records if record["part"] == "write"]
        commits = [record for record in records if record["part"] == "commit"]
        assert len(commits) == batches and {commit["pid"] for commit in commits}.isdisjoint(
            {write["pid"] for write in writes})
        for write in writes:  # tasks: scratch folders only, segment objects only, no manifest
            assert all(Path(folder).name.startswith("ledgerview-sink-") for folder in write["stores"])
            assert write["upload"] and all(key.startswith(f"{topic}-") and "/segments/" in key
                                            for key in write["upload"])
            assert write["create"] == [] and write["delete"] == [] and not Path(write["cwd"], "s3:").exists()
        segments = sum(len(write["upload"]) for write in writes) // 3
        assert segments > 3 * batches  # task outputs were cut at segment.bytes
        for commit in commits:  # the driver: manifests only, no Store, no segment object read or written
            assert commit["stores"] == [] and commit["upload"] == [] and commit["delete"] == []
            assert commit["create"] and all("/manifests/" in key for key in commit["create"])
            assert all("/manifests/" in key or key.startswith("__topics/") for key in commit["read"])
            assert not Path(commit["cwd"], "s3:").exists()
        assert sum(commit["message_bytes"] for commit in commits) < 1_000 * segments
    assert len({write["pid"] for write in probe_records(batch_probe) if write["part"] == "write"}) >= 2


def test_a_remote_topic_is_created_once_and_refused_with_another_partition_count(s3_uri: str) -> None:
    remote = RemoteStore.open(s3_uri)
    created = remote.create_topic("t", 2, {"compression.type": "zstd"})
    assert remote.create_topic("t", 2) == created  # as it is, config too
    with pytest.raises(RemoteTopicExistsError, match="with 2 partitions; it cannot be created with 3"):
        remote.create_topic("t", 3)
    assert [remote.end_offset("t", p) for p in range(2)] == [0, 0] and list(Reader(s3_uri, "t")) == []


# ---------------------------------------------------------------------------------------------- kill -9
CRASH_POINTS = ["sink.remote.commit.after_partition", "sink.remote.commit.after_published"]
"""The commit's partial and complete states (a kill at its start leaves nothing to recover: each run of the suite
restarts two Spark drivers per point, so the suite keeps the points that test recovery)."""


def run_query(uri: str, source: Path, checkpoint: Path) -> tuple[int, list[str], str]:
    with Child("cluster_sink_jobs.py", uri, source, checkpoint, "events") as child:
        return child.finish()


def kill_query_at(point: str, uri: str, source: Path, checkpoint: Path) -> str:
    """Run the query with ``point`` armed: it must die there, its JVM killed; its stderr."""
    with Child("cluster_sink_jobs.py", uri, source, checkpoint, "events", crash_at=point) as child:
        return assert_killed_at(child, point)


@pytest.mark.fault
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_restart_after_a_kill_in_the_commit_leaves_every_row_exactly_once(
        tmp_path: Path, s3_uri: str, point: str) -> None:
    RemoteStore.open(s3_uri).create_topic("events", PARTITIONS, SMALL_SEGMENTS)
    rows = input_rows(1_500)
    source = write_input_files(tmp_path / "input", rows, 3)
    checkpoint = tmp_path / "checkpoint"
    objects = open_object_store(s3_uri)
    logs = [RemoteLog(objects, "events", partition) for partition in range(PARTITIONS)]

    errors = kill_query_at(point, s3_uri, source, checkpoint)
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    recorded = [log.latest().sinks.get(query_id) for log in logs]  # type: ignore[union-attr]
    uploaded = objects.list("events-0/segments") + objects.list("events-1/segments")
    assert uploaded and not (checkpoint / "commits" / "0").exists(), errors[-3000:]
    assert recorded == {"sink.remote.commit.after_partition": [0, None, None],
                        "sink.remote.commit.after_published": [0, 0, 0]}[point]

    code, lines, errors = run_query(s3_uri, source, checkpoint)
    assert code == 0 and lines == ["done"], errors[-2000:]
    assert stored(s3_uri, "events") == expected(rows)
    assert [log.latest().sinks[query_id] for log in logs] == [2, 2, 2]  # type: ignore[union-attr]
    named = {key for log in logs for key in log.latest().object_keys}  # type: ignore[union-attr]
    unnamed = [info.key for log in logs for info in objects.list(f"{log.prefix}/segments") if info.key not in named]
    if point == "sink.remote.commit.after_published":
        assert unnamed == []  # the replay's copies of batch 0 were deleted by its commit
    for log in logs:  # the killed attempt's uploads that no manifest took go with the sweep
        log.remove_unreferenced(now_ms=time.time_ns() // 1_000_000 + 3_600_000, grace_ms=0, unpublished_grace_ms=0)
    assert stored(s3_uri, "events") == expected(rows)
