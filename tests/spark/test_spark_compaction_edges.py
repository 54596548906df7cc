"""Two-phase compaction as Spark work (streaming/compaction.py) on local[2] over a file:// tier, at the edges of
its input: runs whose view keeps no live key (every key tombstoned, only keyless messages kept), first and
incremental. Each publishes the view the single-process compactor writes from the same messages."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compactor import Compactor
from readers import Reader, TableView
from storage import Store
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog, RemoteLogOwnedError, change_unowned
from storage.remote_store import RemoteStore, wall_clock_ms
from streaming.compaction import CompactionRunTooOldError, compact_with_spark
from tests.spark_cluster.test_cluster_compaction import TOPIC, tier_alone

pytestmark = pytest.mark.spark
CONFIG = {"segment.bytes": "4096", "file.delete.delay.ms": "60000"}


def compact_both(spark: SparkSession, store: Store, uri: str) -> None:
    """Upload what is sealed, compact the tier with Spark and the folder with the local compactor; the views
    must be the same."""
    for partition in range(store.topic_metadata(TOPIC).partitions):
        store.roll(TOPIC, partition)
    tier_alone(store, uri, store.topic_metadata(TOPIC).partitions)
    results = compact_with_spark(spark, uri, TOPIC)
    Compactor(store).compact(TOPIC)
    assert [(m.partition, m.offset, m.key, m.value, m.timestamp) for m in Reader(uri, TOPIC, read_compacted=True)] \
        == [(m.partition, m.offset, m.key, m.value, m.timestamp) for m in Reader(store, TOPIC, read_compacted=True)]
    remote = RemoteStore.open(uri)
    for result in results:
        current, view = store.compacted_ledgers(TOPIC, result.partition).open_current(), \
            remote.manifest(TOPIC, result.partition).compacted
        if current is None:  # a partition never written
            assert view is None and result.skipped
            continue
        current[1].close()
        assert view is not None and result.horizon == current[0].horizon == view.horizon
        assert view.dropped_tombstones == current[0].dropped_tombstones  # exact: these logs have few tombstones
    local, tiered = TableView(store, TOPIC), TableView(uri, TOPIC)
    for key in (b"a", b"b", b"c", b"new"):
        assert tiered.get(key) == local.get(key), key


@pytest.mark.parametrize("config", [{}, {"cleanup.policy": "compact"}])
def test_a_run_whose_view_keeps_no_key_publishes_an_empty_view(spark: SparkSession, tmp_path: Path,
                                                                config: dict[str, str]) -> None:
    """Every key tombstoned, in the first run and in an incremental one: phase two's tasks got no rows and failed
    the job (pyarrow: "Must pass schema, or at least one RecordBatch"), so such a topic never compacted again.
    Both compactors record the same tombstones left out."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 2, CONFIG | config)
        store.append(TOPIC, [(b"a", None), (b"b", None)])
        compact_both(spark, store, uri)
        store.append(TOPIC, [(b"a", b"1"), (b"c", b"2"), (b"new", b"3")])
        compact_both(spark, store, uri)
        store.append(TOPIC, [(b"a", None), (b"c", None), (b"new", None)])
        compact_both(spark, store, uri)


def test_a_run_longer_than_half_the_unpublished_delay_publishes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """A sweep deletes objects no manifest names once they are remote.unpublished.delete.delay.ms old: a run that
    took longer than half of it would publish a view naming objects a sweep may have deleted. With 1 ms every run
    does: it publishes nothing and deletes the objects it wrote."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG | {"remote.unpublished.delete.delay.ms": "1"})
        store.append(TOPIC, [(b"a", b"1"), (b"b", b"2")])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
    with pytest.raises(CompactionRunTooOldError, match=r"remote.unpublished.delete.delay.ms=1, .* Nothing was "
                                                       r"published, and its objects are deleted"):
        compact_with_spark(spark, uri, TOPIC)
    assert RemoteStore.open(uri).manifest(TOPIC, 0).compacted is None
    assert open_object_store(uri).list(f"{TOPIC}-0/compacted") == []


def test_the_publish_sweeps_an_unnamed_object_only_once_it_is_older_than_the_unpublished_delay(
        spark: SparkSession, tmp_path: Path) -> None:
    """A run's publish sweeps the log. An object no manifest names, two minutes old (past file.delete.delay.ms,
    60 s), may be another run's or a sink's upload on its way to a publish: it stays for
    remote.unpublished.delete.delay.ms (a day), and goes with the next publish once older than that."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG)
        store.append(TOPIC, [(b"a", b"1"), (b"b", b"2")])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
        stray = tmp_path / "tier" / f"{TOPIC}-0" / "segments" / "00000000000000000000-stray.log"
        stray.write_bytes(b"an upload no manifest names yet")
        two_minutes_ago = time.time() - 120
        os.utime(stray, (two_minutes_ago, two_minutes_ago))
        compact_with_spark(spark, uri, TOPIC)
        assert stray.exists()
        a_day_ago = time.time() - 86_400 - 60
        os.utime(stray, (a_day_ago, a_day_ago))
        store.append(TOPIC, [(b"a", b"3")])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
        compact_with_spark(spark, uri, TOPIC)
        assert not stray.exists()


def test_a_run_that_keeps_only_keyless_messages(spark: SparkSession, tmp_path: Path) -> None:
    """compaction.retain.null.key=true and no live key: the key index's tasks got no rows and failed the job."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG | {"compaction.retain.null.key": "true"})
        store.append(TOPIC, [(None, b"n1"), (b"a", None), (None, b"n2")])
        compact_both(spark, store, uri)
        store.append(TOPIC, [(None, b"n3"), (b"a", b"1")])
        compact_both(spark, store, uri)


def test_a_partition_named_twice_is_compacted_once(spark: SparkSession, tmp_path: Path) -> None:
    """``partitions=[0, 0]`` (``ledgerview compact --spark ... --partition 0 --partition 0``) planned the partition
    twice: its input went into phase one twice, and it had two results."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 2, CONFIG | {"compaction.retain.null.key": "true"})
        store.append(TOPIC, [(b"a", b"1"), (None, b"n"), (b"a", b"2"), (b"b", b"3")])
        store.roll(TOPIC, 0), store.roll(TOPIC, 1)
        tier_alone(store, uri, 2)
        results = compact_with_spark(spark, uri, TOPIC, partitions=[1, 0, 1])
        assert [result.partition for result in results] == [0, 1]
        Compactor(store).compact(TOPIC)
        assert [(m.partition, m.offset, m.value) for m in Reader(uri, TOPIC, read_compacted=True)] == \
            [(m.partition, m.offset, m.value) for m in Reader(store, TOPIC, read_compacted=True)]


def test_a_log_a_data_folder_owns_is_refused_before_anything_is_written(spark: SparkSession, tmp_path: Path) -> None:
    """A tiered topic of a data folder (its remote log claimed, epoch 1) was compacted whole, phase one and two,
    and refused only at the publish: the run had uploaded a ledger and a key index into the log the folder owns,
    which fences every other writer. Now it is refused as it is planned, and nothing is written to the tier."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data", remote=uri) as store:
        store.create_topic(TOPIC, 1, CONFIG | {"remote.storage.enable": "true"})
        store.append(TOPIC, [(f"k{i}".encode(), b"v" * 100) for i in range(100)])
        store.roll(TOPIC, 0)
        store.sync_remote()
    before = sorted(path.relative_to(tmp_path) for path in (tmp_path / "tier").rglob("*"))
    with pytest.raises(RemoteLogOwnedError, match=rf"The remote log of {TOPIC}-0 belongs to a data folder"):
        compact_with_spark(spark, uri, TOPIC)
    assert sorted(path.relative_to(tmp_path) for path in (tmp_path / "tier").rglob("*")) == before


def test_task_bytes_far_below_a_message_cuts_no_more_tasks_than_messages(spark: SparkSession, tmp_path: Path) -> None:
    """task_bytes=1 (``--task-bytes 1``) cut each stage into a task per byte of input: thousands of tasks, most of
    them empty, for a topic of 40 messages, which took minutes. A stage has no more tasks than the items it works
    on (messages in phase one, kept messages and live keys in phase two), and the view is the local compactor's."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG)
        store.append(TOPIC, [(f"k{i % 10}".encode(), b"v" * 50) for i in range(40)])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
        context = spark.sparkContext
        context.setJobGroup("tiny-tasks", "compact_with_spark, task_bytes=1")
        try:
            compact_with_spark(spark, uri, TOPIC, task_bytes=1)
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        tracker = context.statusTracker()
        stages = [stage for job in tracker.getJobIdsForGroup("tiny-tasks")
                  for stage in tracker.getJobInfo(job).stageIds]  # type: ignore[union-attr]
        tasks = [tracker.getStageInfo(stage).numTasks for stage in stages if tracker.getStageInfo(stage)]
        assert tasks and max(tasks) <= 40, tasks
        Compactor(store).compact(TOPIC)
        assert [(m.offset, m.value) for m in Reader(uri, TOPIC, read_compacted=True)] == \
            [(m.offset, m.value) for m in Reader(store, TOPIC, read_compacted=True)]


def test_skipped_partitions_are_reported_as_the_local_compactor_reports_them(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    """Partitions never written, and ones with nothing new since their last run: the results (what ``ledgerview
    compact --spark`` prints) said such a partition's view had a layer even when it had no ledger at all."""
    uri = (tmp_path / "tier").as_uri()

    def fields(results: list[Any]) -> list[tuple[Any, ...]]:
        return [(r.partition, r.ledger_id, r.horizon, r.messages_kept, r.skipped, r.layers) for r in results]

    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 3, CONFIG)
        store.append(TOPIC, [{"key": key, "value": b"1", "partition": 1} for key in (b"a", b"b")])
        store.roll(TOPIC, 0), store.roll(TOPIC, 1), store.roll(TOPIC, 2)
        tier_alone(store, uri, 3)
        for _ in range(2):
            assert fields(compact_with_spark(spark, uri, TOPIC)) == fields(Compactor(store).compact(TOPIC))


def test_kept_keyless_messages_are_spread_over_tasks_of_task_bytes(spark: SparkSession, tmp_path: Path) -> None:
    """compaction.retain.null.key=true: phase two sized the ledger's tasks by the live keys alone, so a ledger of
    mostly keyless messages was written by one task whatever its size (here about 30 times task_bytes, one piece).
    Its pieces now hold about task_bytes each, and the view is the local compactor's."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG | {"compaction.retain.null.key": "true"})
        store.append(TOPIC, [(None, b"v" * 100)] * 1_000 + [(b"a", b"1")])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
        [result] = compact_with_spark(spark, uri, TOPIC, task_bytes=4096)
        assert result.messages_kept == 1_001
        assert result.ledger_pieces > 1 and result.ledger_bytes / result.ledger_pieces <= 2 * 4096, result
        Compactor(store).compact(TOPIC)
        assert [(m.offset, m.key, m.value) for m in Reader(uri, TOPIC, read_compacted=True)] == \
            [(m.offset, m.key, m.value) for m in Reader(store, TOPIC, read_compacted=True)]


def test_offsets_retention_removed_before_the_first_run_count_as_holding_deletions(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    """Found in review: a first run that reads from a log start above 0 never sees the tombstones below it, so
    both compactors record those offsets as possibly holding one (streaming/source.py tells a query behind them)."""
    uri = (tmp_path / "tier").as_uri()
    with Store.open(tmp_path / "data") as store:
        store.create_topic(TOPIC, 1, CONFIG)
        store.append(TOPIC, [(b"a", b"1"), (b"a", None)] + [(f"k{i}".encode(), b"v" * 100) for i in range(100)])
        store.roll(TOPIC, 0)
        tier_alone(store, uri, 1)
        start = store.segments(TOPIC, 0)[1].base_offset
        store.delete_records(TOPIC, 0, start)
        change_unowned(RemoteLog(open_object_store(uri), TOPIC, 0),
                       lambda manifest: replace(manifest, log_start_offset=start), wall_clock_ms)
        compact_both(spark, store, uri)
        view = RemoteStore.open(uri).manifest(TOPIC, 0).compacted
        assert view is not None and view.dropped_tombstones[0] == (0, start - 1)
