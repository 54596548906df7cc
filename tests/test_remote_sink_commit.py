"""The object-store sink's task write and commit (streaming/remote_sink.py) called directly, without Spark (a task
outside Spark is task 0), against the S3-protocol server: placement of multi-segment task outputs by
``offset_shift`` (reads from any offset and by timestamp land right), a replayed batch skipped, uploads no manifest
took deleted, and a log a data folder owns refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from readers import Reader
from storage import Store
from storage.remote_log import RemoteLog, RemoteLogOwnedError, change_unowned, may_still_publish
from storage.remote_store import RemoteStore, wall_clock_ms
from streaming.remote_sink import (
    SinkBatchTooOldError,
    UploadedSegments,
    abort_uploads,
    commit_uploads,
    write_task_segments,
)

pytestmark = pytest.mark.slow  # a moto S3 server and many requests: after the fast suite

ROWS = 3_000


def task_rows(first: int, count: int) -> pa.Table:
    numbers = range(first, first + count)
    return pa.table({"key": [f"k{i % 7}" for i in numbers], "value": [f"v{i:06d}".ljust(60, ".") for i in numbers],
                     "timestamp": pa.array([1_000 + i for i in numbers], pa.int64())})


def written(uri: str, first: int, count: int, batch: int, sink: str | None = "query") -> UploadedSegments:
    return write_task_segments(uri, "t", sink, batch, iter(task_rows(first, count).to_batches(max_chunksize=100)))


def test_task_segments_are_placed_by_offset_shift_and_a_replayed_batch_is_skipped(s3_uri: str) -> None:
    remote = RemoteStore.open(s3_uri, manifest_max_age_ms=0)
    remote.create_topic("t", 2, {"segment.bytes": "8192", "index.interval.bytes": "512"})
    tasks = [written(s3_uri, 0, ROWS // 2, 0), written(s3_uri, ROWS // 2, ROWS // 2, 0)]
    assert all(len(infos) > 2 for task in tasks for infos in task.segments.values())
    commit_uploads(s3_uri, "t", tasks, 0)
    published = [RemoteLog(remote.objects, "t", p).latest() for p in range(2)]
    commit_uploads(s3_uri, "t", [written(s3_uri, 0, ROWS // 2, 0)], 0)  # a replay of batch 0: nothing appended
    assert [RemoteLog(remote.objects, "t", p).latest() for p in range(2)] == published

    messages = list(Reader(s3_uri, "t"))
    assert sorted(m.value or b"" for m in messages) == sorted(v.encode() for v in task_rows(0, ROWS).column("value")
                                                       .to_pylist())
    for partition in range(2):
        mine = [m for m in messages if m.partition == partition]
        assert [m.offset for m in mine] == list(range(len(mine)))
        assert [m.timestamp for m in mine] == sorted(m.timestamp for m in mine)  # task order, each task's order
        middle = mine[len(mine) * 2 // 3]  # inside a later segment of the second task: found through its index
        batches = list(remote.read_batches("t", partition, middle.offset))
        assert batches[0].column("offset")[0].as_py() == middle.offset
        assert batches[0].column("value")[0].as_py() == middle.value
        assert remote.offset_for_timestamp("t", partition, middle.timestamp) == middle.offset
    assert all(manifest is not None and manifest.sinks == {"query": 0} for manifest in published)


def test_uploads_no_manifest_took_are_deleted_and_a_claimed_log_is_refused(tmp_path: Path, s3_uri: str) -> None:
    remote = RemoteStore.open(s3_uri)
    remote.create_topic("t", 1)
    aborted = written(s3_uri, 0, 100, 0)
    abort_uploads(s3_uri, "t", [aborted])
    assert remote.objects.list("t-0/segments") == []
    commit_uploads(s3_uri, "t", [written(s3_uri, 0, 100, 1, sink=None)], 1)  # df.write: no sink id recorded
    manifest = RemoteLog(remote.objects, "t", 0).latest()
    assert manifest is not None and manifest.sinks == {} and manifest.end_offset == 100

    with Store.open(tmp_path / "data", remote=s3_uri) as store:  # a data folder claims the log
        store.create_topic("t", 1, {"remote.storage.enable": "true"})
        store.claim_remote("t", 0)
    with pytest.raises(RemoteLogOwnedError, match="belongs to a data folder"):
        commit_uploads(s3_uri, "t", [written(s3_uri, 100, 10, 2)], 2)


def test_a_batch_whose_uploads_a_sweep_may_have_deleted_is_refused_not_published(s3_uri: str) -> None:
    """A sweep deletes objects no manifest names once they are remote.unpublished.delete.delay.ms old; it cannot tell
    a batch still running from a crashed upload. A commit that came that late published a manifest naming objects
    the sweep had deleted: the topic could no longer be read. It is refused before any partition is published,
    so running the write again duplicates nothing (a df.write records no batch id to skip a partition by)."""
    delay_ms = 600_000
    remote = RemoteStore.open(s3_uri, manifest_max_age_ms=0)
    remote.create_topic("t", 2, {"remote.unpublished.delete.delay.ms": str(delay_ms)})
    commit_uploads(s3_uri, "t", [written(s3_uri, 0, 100, 0, sink=None)], 0)
    logs = [RemoteLog(remote.objects, "t", partition) for partition in range(2)]
    before = [log.latest() for log in logs]
    slow = written(s3_uri, 100, 100, 1, sink=None)
    assert sorted(slow.segments) == [0, 1]
    later = slow.uploaded_ms + delay_ms + 1
    for log in logs:
        log.remove_unreferenced(now_ms=later, grace_ms=60_000, unpublished_grace_ms=delay_ms)
    assert not any(remote.objects.list(key) for infos in slow.segments.values() for info in infos
                   for key in info.object_keys)  # swept: the sweep cannot tell them from a crashed upload's
    with pytest.raises(SinkBatchTooOldError, match=r"Batch 1 of the sink to t: .* "
                                                   r"remote.unpublished.delete.delay.ms=600000.* "
                                                   r"Nothing of it was published.* run the write again"):
        commit_uploads(s3_uri, "t", [slow], 1, clock=lambda: later)
    assert [log.latest() for log in logs] == before
    assert sorted(m.value or b"" for m in Reader(s3_uri, "t")) == sorted(
        value.encode() for value in task_rows(0, 100).column("value").to_pylist())
    commit_uploads(s3_uri, "t", [written(s3_uri, 100, 100, 1, sink=None)], 1)  # the write run again
    assert len(list(Reader(s3_uri, "t"))) == 200


def test_a_batch_slower_than_file_delete_delay_is_kept_by_the_sweep_and_published(s3_uri: str) -> None:
    """The sweep deleted uploads no manifest named once they were file.delete.delay.ms old (60 s by default), and
    the commit refused a batch whose first upload was older than half of it: a streaming batch of tasks in waves,
    or a first batch catching up on a backlog, failed every time it ran. Uploads no manifest names now wait
    remote.unpublished.delete.delay.ms (a day by default); segments a manifest dropped still go after
    file.delete.delay.ms."""
    remote = RemoteStore.open(s3_uri, manifest_max_age_ms=0)
    config = remote.create_topic("t", 1).config
    assert (config.file_delete_delay_ms, config.remote_unpublished_delete_delay_ms) == (60_000, 86_400_000)
    commit_uploads(s3_uri, "t", [written(s3_uri, 0, 100, 0, sink=None)], 0)
    log = RemoteLog(remote.objects, "t", 0)
    dropped = log.latest().object_keys  # type: ignore[union-attr]
    change_unowned(log, lambda manifest: dataclasses.replace(manifest, segments=(),
                                                             log_start_offset=manifest.end_offset), wall_clock_ms)
    slow = written(s3_uri, 100, 100, 1, sink=None)
    ten_minutes_on = slow.uploaded_ms + 600_000
    swept = log.remove_unreferenced(now_ms=ten_minutes_on, grace_ms=config.file_delete_delay_ms,
                                    unpublished_grace_ms=config.remote_unpublished_delete_delay_ms)
    assert set(swept) >= dropped and not set(swept) & {key for info in slow.segments[0] for key in info.object_keys}
    commit_uploads(s3_uri, "t", [slow], 1, clock=lambda: ten_minutes_on)
    assert [m.offset for m in Reader(s3_uri, "t")] == list(range(100, 200))


def test_writers_of_the_tier_alone_publish_within_half_the_unpublished_delay() -> None:
    """The other half is for the publishes themselves and the skew between the object store's clock and ours."""
    assert may_still_publish(1_000, 1_000 + 300_000, 600_000)
    assert not may_still_publish(1_000, 1_000 + 300_001, 600_000)
