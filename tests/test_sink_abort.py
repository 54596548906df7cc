"""A streaming sink's abort removes only its own query's staged files (DESIGN.md invariant 7): two queries writing
one topic stage files under their own sink ids with the same batch ids, and one query's failed batch must not
destroy what the other has staged but not yet committed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from storage import Store
from streaming.sink import SinkOptions, StreamSink, stage_task_rows
from streaming.sink_commit import SinkFolders, commit_batch

TOPIC = "events"
BATCH_ID = 4


def staged(data: Path, sink_id: str) -> list[str]:
    with Store.open(data) as store:
        staging = SinkFolders.of(store, TOPIC, sink_id).staging
        return sorted(path.name for path in staging.iterdir()) if staging.is_dir() else []


def test_abort_removes_its_own_staged_files_and_leaves_another_querys(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=2)
    options = SinkOptions(str(data), TOPIC)
    rows = pa.record_batch({"key": [b"k1", b"k2"], "value": [b"v1", b"v2"]})
    failing = stage_task_rows(options, "query-a", BATCH_ID, iter([rows]))
    other = stage_task_rows(options, "query-b", BATCH_ID, iter([rows]))
    assert staged(data, "query-a") == list(failing.files) and staged(data, "query-b") == list(other.files) != []

    StreamSink(options).abort([failing, None], BATCH_ID)

    assert staged(data, "query-a") == []
    assert staged(data, "query-b") == list(other.files)
    with Store.open(data) as store:  # the other query's batch still commits whole
        commit_batch(store, TOPIC, "query-b", BATCH_ID, other.files)
        stored = [store.read(TOPIC, partition).column("value").to_pylist() for partition in range(2)]
    assert sorted(value for values in stored for value in values) == [b"v1", b"v2"]


def test_abort_with_only_failed_tasks_removes_nothing_staged_by_other_queries(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic(TOPIC)
    options = SinkOptions(str(data), TOPIC)
    other = stage_task_rows(options, "query-b", BATCH_ID, iter([pa.record_batch({"value": [b"v"]})]))
    StreamSink(options).abort([None], BATCH_ID)
    assert staged(data, "query-b") == list(other.files) != []



def test_a_topic_deleted_and_created_again_takes_a_sinks_batch_its_former_log_took(tmp_path: Path) -> None:
    """The sinks' records of committed batches stayed behind when their topic was deleted, so the same query's
    batch id into the topic created again was taken as committed and its rows dropped."""
    data = tmp_path / "data"
    options = SinkOptions(str(data), TOPIC)
    for value in (b"old", b"new"):
        with Store.open(data) as store:
            if value == b"new":
                store.delete_topic(TOPIC)
            store.create_topic(TOPIC)
        task = stage_task_rows(options, "query-a", BATCH_ID, iter([pa.record_batch({"key": [b"k"], "value": [value]})]))
        with Store.open(data) as store:
            assert commit_batch(store, TOPIC, "query-a", BATCH_ID, task.files)
            assert store.read(TOPIC, 0).column("value").to_pylist() == [value]
