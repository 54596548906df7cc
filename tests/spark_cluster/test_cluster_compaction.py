"""Two-phase compaction as Spark work (streaming/compaction.py) on executors in processes of their own, over a
remote log that no data folder owns, on a real S3-protocol server: the compacted view it publishes is the one the
single-process compactor writes from the same messages (same messages, offsets, timestamps and headers; the same
answer to every key lookup), first and incremental runs alike, with a partition larger than one task's budget
spread over several tasks. The data folder the input came from is moved away before each run, so the executors
read and write the object store alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from compactor import Compactor
from readers import Reader, TableView
from storage import Store
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog, change_unowned
from storage.remote_store import RemoteStore, remote_topic_key, wall_clock_ms
from tests.spark_cluster.cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TOPIC = "t"
CONFIG = {"segment.bytes": "8192", "index.interval.bytes": "1024", "compaction.retain.null.key": "true",
          "file.delete.delay.ms": "60000"}
KEYS = 2_000
TASK_BYTES = 16 * 1024
"""Far below a partition's input and its ledger: both phases take several tasks per partition."""
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())]))


def changes(first: int, count: int) -> pa.Table:
    """Keyed updates over KEYS keys (every 7th a tombstone, every 11th with a header) and some keyless messages."""
    numbers = range(first, first + count)
    return pa.table({
        "key": [None if n % 97 == 0 else f"key-{(n * 7919) % KEYS:04d}".encode() for n in numbers],
        "value": [None if n % 7 == 0 and n % 97 else f"value {n} ".encode() * (1 + n % 5) for n in numbers],
        "headers": pa.array([[{"key": "n", "value": str(n).encode()}] if n % 11 == 0 else None for n in numbers],
                            HEADERS),
    })


def tier_alone(store: Store, uri: str, partitions: int) -> None:
    """Copy the store's sealed segments to the remote tier as logs no data folder owns, as a Spark sink with an
    object-store path writes them."""
    objects = open_object_store(uri)
    objects.create(remote_topic_key(TOPIC), store.topic_metadata(TOPIC).encode())
    for partition in range(partitions):
        log = RemoteLog(objects, TOPIC, partition)
        latest = log.latest()
        uploaded = latest.end_offset if latest else 0
        infos = tuple(log.upload(segment) for segment in store.partition_log(TOPIC, partition).segments[:-1]
                      if segment.base_offset >= uploaded)
        change_unowned(log, lambda manifest, new=infos: manifest.__class__(
            manifest.version, manifest.epoch, manifest.log_start_offset, manifest.segments + new,
            manifest.published_ms, manifest.compacted, manifest.sinks), wall_clock_ms)


def assert_same_views(store: Store, uri: str, partitions: int) -> None:
    remote = RemoteStore.open(uri)
    for partition in range(partitions):
        local_cursor, local_ledger = store.compacted_ledgers(TOPIC, partition).open_current()
        remote_cursor, remote_ledger = remote.compacted_ledgers(TOPIC, partition).open_current()
        assert remote_cursor.horizon == local_cursor.horizon
        latest = {m.key: m for m in Reader(store, TOPIC, partitions=[partition])
                  if m.key is not None and m.offset <= remote_cursor.horizon}
        left_out = [m.offset for m in latest.values() if m.value is None]
        assert left_out and all(any(first <= offset <= last for first, last in remote_cursor.dropped_tombstones)
                                for offset in left_out)
        assert pa.Table.from_batches(list(remote_ledger.read_batches())).equals(
            pa.Table.from_batches(list(local_ledger.read_batches())))
        local_ledger.close(), remote_ledger.close()
    compacted = [(m.partition, m.offset, m.key, m.value, m.timestamp, m.headers)
                 for m in Reader(uri, TOPIC, read_compacted=True)]
    assert compacted == [(m.partition, m.offset, m.key, m.value, m.timestamp, m.headers)
                         for m in Reader(store, TOPIC, read_compacted=True)]
    local, tiered = TableView(store, TOPIC), TableView(uri, TOPIC)
    for number in range(0, KEYS, 7):
        key = f"key-{number:04d}".encode()
        assert tiered.get(key) == local.get(key), key


def test_spark_compacts_a_remote_log_into_the_view_the_single_process_compactor_writes(
        tmp_path: Path, s3_uri: str, spark_cluster: SparkCluster) -> None:
    folder, away = tmp_path / "data", tmp_path / "moved-away"
    with Store.open(folder) as store:
        store.create_topic(TOPIC, 2, CONFIG)
        store.append(TOPIC, changes(0, 6_000))
        store.roll(TOPIC, 0), store.roll(TOPIC, 1)
        tier_alone(store, s3_uri, 2)
    folder.rename(away)  # the executors must find everything on the object store
    first = spark_cluster.run("compact", uri=s3_uri, topic=TOPIC, task_bytes=TASK_BYTES)
    away.rename(folder)
    with Store.open(folder) as store:
        Compactor(store).compact(TOPIC)
        assert_same_views(store, s3_uri, 2)
        assert all(result["ledger_pieces"] > 1 and result["key_index_pieces"] > 1 for result in first)
        store.append(TOPIC, changes(6_000, 1_500))
        store.roll(TOPIC, 0), store.roll(TOPIC, 1)
        tier_alone(store, s3_uri, 2)
        new = {p: store.end_offset(TOPIC, p) - 1 - result["horizon"] for p, result in enumerate(first)}
    folder.rename(away)
    second = spark_cluster.run("compact", uri=s3_uri, topic=TOPIC, task_bytes=TASK_BYTES)
    away.rename(folder)
    with Store.open(folder) as store:
        Compactor(store).compact(TOPIC)
        assert_same_views(store, s3_uri, 2)
    for before, after in zip(first, second, strict=True):
        assert after["ledger_id"] == before["ledger_id"] + 1
        # an incremental run reads the previous ledger and what is new, not the whole log again
        assert after["messages_read"] == before["messages_kept"] + new[after["partition"]]
    assert spark_cluster.run("compact", uri=s3_uri, topic=TOPIC, task_bytes=TASK_BYTES)[0]["skipped"]


def test_the_cli_compacts_a_remote_tier_with_spark(tmp_path: Path, s3_uri: str) -> None:
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 2, CONFIG)
        store.append(TOPIC, changes(0, 3_000))
        store.roll(TOPIC, 0), store.roll(TOPIC, 1)
        tier_alone(store, s3_uri, 2)
        Compactor(store).compact(TOPIC)
        expected = [(m.partition, m.offset, m.key, m.value) for m in Reader(store, TOPIC, read_compacted=True)]
    done = subprocess.run([sys.executable, "-m", "ledgerview", "compact", TOPIC, "--spark", "local[1]", "--remote",
                           s3_uri, "--json", "--data", str(tmp_path / "no-folder")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["partition"] for r in results] == [0, 1] and all(r["ledger_id"] == 1 for r in results)
    assert [(m.partition, m.offset, m.key, m.value) for m in Reader(s3_uri, TOPIC, read_compacted=True)] == expected
    assert not (tmp_path / "no-folder").exists()
