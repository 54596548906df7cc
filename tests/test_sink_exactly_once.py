"""The sink's exactly-once commit across a real crash (DESIGN.md invariant 7; 8: the commit runs in a Python
worker the JVM spawns, not in the process that started the query).

A streaming query runs in its own process and JVM (tests/processes/spark_sink_job.py). A crash point inside the
sink's commit kills that JVM with SIGKILL: before the commit starts (the tasks have staged their files), between
the partitions of the append, and after the store recorded the commit but before Spark wrote its own commit. The
query is restarted from its checkpoint in a new process; every input row must then be in the topic exactly once,
and no staged or pending file may be left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage import Store
from streaming.sink_commit import SinkFolders, SinkRecord, read_committed_batch
from tests.processes.children import Child, assert_killed_at
from tests.spark.inputs import numbered_rows, stored_values, write_input_files

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow]

TOPIC = "events"
FILES = 3
ROWS = 600


def run_job(data: Path, source: Path, checkpoint: Path) -> tuple[int, list[str], str]:
    with Child("spark_sink_job.py", data, source, checkpoint, TOPIC) as child:
        return child.finish()


def kill_job_at(point: str, data: Path, source: Path, checkpoint: Path) -> None:
    """Run the job with ``point`` armed: it must die there, its JVM killed."""
    with Child("spark_sink_job.py", data, source, checkpoint, TOPIC, crash_at=point) as child:
        assert_killed_at(child, point)


def query_id(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


@pytest.mark.parametrize("point", ["sink.commit.after_partition_append", "sink.commit.after_committed_record"])
def test_a_restart_after_a_crash_in_the_commit_leaves_every_row_exactly_once(tmp_path: Path, point: str) -> None:
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=3)
    rows = numbered_rows(ROWS)
    source = write_input_files(tmp_path / "input", rows, FILES)

    kill_job_at(point, data, source, checkpoint)
    with Store.open(data) as store:
        record = SinkRecord.read(SinkFolders.of(store, TOPIC, query_id(checkpoint)).record)
        if point == "sink.commit.after_partition_append":
            assert record.pending_batch == 0 and 0 < len(stored_values(store, TOPIC)) < ROWS // FILES
        else:
            assert record.committed_batch == 0 and not (checkpoint / "commits" / "0").exists()

    code, lines, errors = run_job(data, source, checkpoint)
    assert code == 0 and lines == [f"done {FILES - 1}"], errors[-2000:]
    with Store.open(data) as store:
        assert stored_values(store, TOPIC) == sorted(rows.column("value").to_pylist())
        folders = SinkFolders.of(store, TOPIC, query_id(checkpoint))
        assert read_committed_batch(store, TOPIC, query_id(checkpoint)) == FILES - 1
        assert list(folders.staging.iterdir()) == [] and list(folders.pending.iterdir()) == []


def test_a_resumed_commit_whose_pending_file_a_power_loss_damaged_rolls_forward_from_the_replay(
        tmp_path: Path) -> None:
    """Staged files are not fsynced: after a power loss a pending file may come back with a block of zeros. The
    resumed commit finds its CRC-32C wrong and uses the replay's files, which hold the same rows."""
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=3)
    rows = numbered_rows(ROWS)
    source = write_input_files(tmp_path / "input", rows, FILES)
    kill_job_at("sink.commit.after_partition_append", data, source, checkpoint)
    with Store.open(data) as store:
        folders = SinkFolders.of(store, TOPIC, query_id(checkpoint))
        record = SinkRecord.read(folders.record)
        appended = len(stored_values(store, TOPIC))
    assert record.pending_batch == 0 and record.pending_files and 0 < appended < ROWS // FILES
    damaged = folders.pending / record.pending_files[0]
    content = bytearray(damaged.read_bytes())
    value_at = content.index(b"n150")  # one value's bytes: the file still parses as Arrow, with a wrong value
    content[value_at : value_at + 4] = bytes(4)
    damaged.write_bytes(bytes(content))

    code, lines, errors = run_job(data, source, checkpoint)
    assert code == 0 and lines == [f"done {FILES - 1}"], errors[-2000:]
    with Store.open(data) as store:
        assert stored_values(store, TOPIC) == sorted(rows.column("value").to_pylist())
        assert list(folders.staging.iterdir()) == [] and list(folders.pending.iterdir()) == []
