"""Remote-tier defects found by earlier reviews, each with the test that failed before its fix: folders restored at
the remote log's end, the sweep's order, leftovers of killed writes, advice in errors, a fenced folder's disk.
Against the moto S3 server (tests/s3_server.py) and file:// tiers, as tests/test_remote_bug_bash.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from readers import Reader
from storage import Store
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog
from storage.remote_tier import RemoteLogDivergedError
from tests.conftest import ManualClock
from tests.test_remote_tier import TIERED, produce

pytestmark = pytest.mark.slow  # an S3 server and many requests per test: after the fast suite


def test_a_folder_restored_at_the_remote_end_is_refused_and_keeps_its_new_messages(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """A folder put back from an older copy appends other messages at offsets the tier holds, in segments that end
    exactly at the remote log's end, then one that starts there. Only a segment spanning the end was refused: sync
    appended the next segment to the remote log (which so held the old messages below the end and the new ones
    above), and local retention took the new messages below the end for uploaded ones and deleted them (or, while
    they were in the active segment, failed with an IndexError)."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with Store.open(data_dir, remote=tier, clock=clock) as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 100)
        store.sync_remote()
        backup = tmp_path / "backup"
        shutil.copytree(data_dir, backup)
        produce(store, "t", 100, start=100)
        store.sync_remote()
    before = RemoteLog(open_object_store(tier), "t", 0).latest()
    assert before is not None
    shutil.rmtree(data_dir)
    shutil.copytree(backup, data_dir)
    with Store.open(data_dir, clock=clock) as store:
        restored_end = store.end_offset("t", 0)
        assert restored_end < before.end_offset
        store.append("t", [(f"k{i}", b"new") for i in range(restored_end, restored_end + 3)], partition=0)
        clock.advance(1)
        store.enforce_retention("t")  # local.retention.ms=0: only what is uploaded may go, not the active segment
        assert store.read("t", 0, restored_end).column("value").to_pylist() == [b"new"] * 3
        store.append("t", [(f"k{i}", b"new") for i in range(restored_end + 3, before.end_offset)], partition=0)
        store.roll("t", 0)  # a sealed segment that ends exactly at the remote end
        store.append("t", [(f"k{i}", b"new") for i in range(before.end_offset, before.end_offset + 20)], partition=0)
        store.roll("t", 0)  # and one that starts there
        with pytest.raises(RemoteLogDivergedError, match=f"below the remote log's end {before.end_offset}"):
            store.sync_remote()
        with pytest.raises(RemoteLogDivergedError):
            store.enforce_retention("t")
        new = store.read("t", 0, restored_end).column("value").to_pylist()
        assert new == [b"new"] * (before.end_offset + 20 - restored_end)
    assert RemoteLog(open_object_store(tier), "t", 0).latest() == before
    assert [message.offset for message in Reader(tier, "t")] == list(range(before.end_offset))

