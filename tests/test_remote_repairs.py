"""Remote-tier defects found by earlier reviews and the tests of their fixes (each defect's test failed before its
fix): folders restored at the remote log's end, the sweep's order, leftovers of killed creates and claims, a
damaged newest manifest or topic.json, a fenced folder's disk, what verify checks on the tier. Against the moto S3
server (tests/s3_server.py) and file:// tiers, as tests/test_remote_bug_bash.py."""

from __future__ import annotations

import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from compactor import Compactor
from readers import Reader
from storage import Store
from storage.files import REMOTE_EPOCH_RECORD
from storage.object_store import open_object_store
from storage.records import encode_record
from storage.remote_key_index import TAIL
from storage.remote_log import RemoteLog, RemoteLogFencedError, RemoteManifestDamagedError, change_unowned
from storage.remote_store import RemoteStore, wall_clock_ms
from storage.remote_tier import RemoteLogDivergedError
from storage.retention import RetentionReason
from storage.topics import CorruptTopicMetadataError
from storage.verification import verify_topics
from tests.conftest import ManualClock
from tests.processes.children import Child
from tests.s3_server import S3Server
from tests.test_remote_bug_bash import ListingHoldingRelay
from tests.test_remote_tier import TIERED, only_remote, produce, tiered_store

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
        clock.advance(1)
        assert store.enforce_retention("t") == []  # refused by the tier: only retention.ms (7 days) applies
        new = store.read("t", 0, restored_end).column("value").to_pylist()
        assert new == [b"new"] * (before.end_offset + 20 - restored_end)
    assert RemoteLog(open_object_store(tier), "t", 0).latest() == before
    assert [message.offset for message in Reader(tier, "t")] == list(range(before.end_offset))


def test_a_segment_published_while_a_sweep_runs_is_never_deleted(data_dir: Path, s3_server: S3Server, s3_uri: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer of the tier alone (the Spark sink) uploads a segment and publishes it while a sweep (distributed
    compaction's) runs with no grace periods. The sweep read the manifests first and listed the objects
    after: a segment published between was taken for an upload that died before its publish and deleted, and the
    remote log named objects that were gone."""
    RemoteStore.open(s3_uri).create_topic("t", 1)
    writer = RemoteLog(open_object_store(s3_uri), "t", 0)  # straight to the server
    with Store.open(data_dir) as local:  # where the segment is written before its upload
        local.create_topic("t", 1)
        local.append("t", [(f"k{i}", b"v") for i in range(10)], partition=0)
        local.roll("t", 0)
        segment = local.partition_log("t", 0).segments[0]
        relay = ListingHoldingRelay(s3_server.endpoint, marker=b"segments")
        with monkeypatch.context() as patched:
            patched.setenv("AWS_ENDPOINT_URL", relay.endpoint)
            sweeper = RemoteLog(open_object_store(s3_uri), "t", 0)
        relay.armed = True
        try:
            with ThreadPoolExecutor(1) as pool:
                sweeping = pool.submit(sweeper.remove_unreferenced, now_ms=wall_clock_ms() + 60_000, grace_ms=0,
                                       unpublished_grace_ms=0)
                assert relay.held.wait(timeout=60)  # the sweep's listing of the segment objects waits
                info = writer.upload(segment)
                change_unowned(writer, lambda manifest: dataclasses.replace(manifest, segments=(info,)), wall_clock_ms)
                relay.release.set()
                sweeping.result(timeout=60)
        finally:
            relay.release.set()
            relay.close()
    assert set(info.object_keys) <= {listed.key for listed in writer.objects.list("t-0/segments")}
    assert [message.offset for message in Reader(s3_uri, "t")] == list(range(10))


def test_a_fenced_folder_still_runs_the_retention_that_needs_no_tier(data_dir: Path, tmp_path: Path,
                                                                     clock: ManualClock) -> None:
    """Another folder claimed the partition; this one goes on appending locally. Its retention raised
    RemoteLogFencedError before deleting anything, so its disk filled for ever. Now retention.ms deletes its expired
    local segments, while local.retention.ms (0 here), which deletes uploaded copies only, deletes none of those it
    could not upload."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with tiered_store(data_dir, tier, clock, {**TIERED, "retention.ms": "60000"}) as primary:
        produce(primary, "t", 100)
        primary.sync_remote()
        with tiered_store(tmp_path / "standby", tier, clock) as standby:
            standby.claim_remote("t", 0)
        produce(primary, "t", 100, start=100)
        clock.advance(120_000)
        produce(primary, "t", 100, start=200)
        with pytest.raises(RemoteLogFencedError):
            primary.sync_remote()
        deleted = primary.enforce_retention("t")
        assert deleted and {segment.reason for segment in deleted} == {RetentionReason.RETENTION_MS}
        start = primary.start_offset("t", 0)
        assert 100 < start <= 200  # the expired messages are gone, the fenced folder's recent ones all kept
        assert primary.read("t", 0, start).column("offset").to_pylist() == list(range(start, 300))


@pytest.mark.fault
def test_creates_killed_before_their_link_leave_no_temporary_file_on_a_mount(data_dir: Path, tmp_path: Path) -> None:
    """A file:// tier creates a manifest or the topic's metadata by a hard link from a temporary file; a writer killed
    between the two left that file in the tier for ever. The sweep deletes it after file.delete.delay.ms (0 here)."""
    tier = tmp_path / "mount" / "tier"
    with Store.open(data_dir, remote=f"file://{tier}") as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 100)
    for hit in (1, 2):  # the topic's metadata, then (with the metadata there) the partition's first manifest
        with Child("remote_sync.py", data_dir, "sync", crash_at=f"remote.create.before_link:{hit}") as child:
            assert child.finish()[0] == -9
    assert sorted(path.relative_to(tier).parts[0] for path in tier.rglob("*.tmp")) == ["__topics", "t-0"]
    with Store.open(data_dir) as store:
        [synced] = store.sync_remote()
        store.enforce_retention("t")
    assert not list(tier.rglob("*.tmp"))
    assert [message.offset for message in Reader(f"file://{tier}", "t")] == list(range(synced.remote_end_offset))


def test_a_damaged_newest_manifest_says_how_to_repair_it_and_the_repair_works(data_dir: Path, tmp_path: Path,
                                                                              clock: ManualClock) -> None:
    """The error named the object and its damage, and nothing the operator could do about it. Now it names the
    newest older manifest that reads and the commands that repair the log from the data folder; doing what it says
    makes the partition readable and uploadable again."""
    tier = tmp_path / "mount" / "tier"
    with tiered_store(data_dir, f"file://{tier}", clock, {**TIERED, "local.retention.ms": "-2"}) as store:
        for start in (0, 100):
            produce(store, "t", 100, start=start)
            store.sync_remote()
    *_, older, newest = sorted((tier / "t-0" / "manifests").glob("*.json"))
    damaged = bytearray(newest.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    with Store.open(data_dir, clock=clock) as store:
        with pytest.raises(RemoteManifestDamagedError, match=rf"{newest.name}.* version {int(older.stem)} .*"
                                                              r"`ledgerview remote sync`") as raised:
            store.sync_remote()
        assert raised.value.older is not None
        assert f"starts at or below {raised.value.older.end_offset}" in str(raised.value)
        newest.unlink()
        [synced] = store.sync_remote()
    assert synced.uploaded and synced.remote_end_offset > raised.value.older.end_offset
    assert [message.offset for message in Reader(f"file://{tier}", "t")] == list(range(synced.remote_end_offset))


def test_sync_writes_a_damaged_or_missing_remote_topic_metadata_again(data_dir: Path, tmp_path: Path,
                                                                       clock: ManualClock) -> None:
    """Readers of the tier alone find a topic by its __topics/<topic>/topic.json. A damaged one was never written
    again (its create-once write was refused for ever), so the tier alone could no longer read the topic."""
    tier = tmp_path / "mount" / "tier"
    with tiered_store(data_dir, f"file://{tier}", clock) as store:
        produce(store, "t", 100)
        [synced] = store.sync_remote()
        metadata = tier / "__topics" / "t" / "topic.json"
        metadata.write_bytes(metadata.read_bytes().replace(b'"partitions"', b'"partitionz"'))
        with pytest.raises(CorruptTopicMetadataError):
            list(Reader(f"file://{tier}", "t"))
        store.sync_remote()
        assert [m.offset for m in Reader(f"file://{tier}", "t")] == list(range(synced.remote_end_offset))
        metadata.unlink()
        store.sync_remote()
        assert [m.offset for m in Reader(f"file://{tier}", "t")] == list(range(synced.remote_end_offset))


def test_verify_reports_damaged_remote_index_objects_and_key_index_directories(data_dir: Path, tmp_path: Path,
                                                                                 clock: ManualClock) -> None:
    """Reads work around a remote index that does not parse, is gone or points elsewhere, and around a damaged key
    index (slower, never wrong), but nothing repairs them there as opening a partition repairs a local index:
    verify reported the local ones and passed these over."""
    tier = tmp_path / "mount" / "tier"
    with tiered_store(data_dir, f"file://{tier}", clock, {**TIERED, "segment.bytes": "8192"}) as store:
        for first in range(0, 300, 10):  # a batch per append, several per segment: indexes with entries
            store.append("t", [(f"key{i:05d}", f"v{i}".encode() * 10) for i in range(first, first + 10)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        only_remote(store, clock)
        assert verify_topics(store, ["t"], lambda _: None).problems == []
    cut, pointing_elsewhere = sorted(tier.rglob("*.index"))[:2]
    cut.write_bytes(cut.read_bytes()[:-3])
    entries = bytearray(pointing_elsewhere.read_bytes())
    entries[4] += 1  # the first entry's position (int32, little-endian) one byte past its batch
    pointing_elsewhere.write_bytes(bytes(entries))
    gone = sorted(tier.rglob("*.timeindex"))[0]
    gone.unlink()
    [keys_object] = tier.rglob("*.keys")
    damaged = bytearray(keys_object.read_bytes())
    damaged[-TAIL.size - 1] ^= 0xFF  # the directory's last byte
    keys_object.write_bytes(bytes(damaged))
    with Store.open(data_dir, clock=clock) as store:
        problems = verify_topics(store, ["t"], lambda _: None).problems
    for path, finding in ((cut, "not whole index entries"), (pointing_elsewhere, "does not point at the batch"),
                          (gone, "the tier holds none"), (keys_object, "its directory fails its CRC-32C")):
        assert any(str(path) in problem and finding in problem for problem in problems), (path, problems)
    [key_index_problem] = [problem for problem in problems if str(keys_object) in problem]
    assert "compact the partition again" in key_index_problem and "verify --repair" not in key_index_problem


def _first_sync_killed_at(data_dir: Path, tmp_path: Path, crash_at: str) -> str:
    """A tiered topic of 100 messages whose first sync (its claim of the partition) is killed at ``crash_at``;
    returns the tier's URI."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with Store.open(data_dir, remote=tier) as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 100)
    with Child("remote_sync.py", data_dir, "sync", crash_at=crash_at) as child:
        assert child.finish()[0] == -9
    return tier


@pytest.mark.fault
def test_a_claim_killed_after_its_publish_is_finished_by_the_next_sync(data_dir: Path, tmp_path: Path) -> None:
    """The first upload claims the partition: it publishes a manifest under epoch 1, then records the epoch in the
    folder. Killed between the two, the folder was fenced by its own claim ('this data folder has not claimed it'),
    and its operator could not tell that claim from another folder's. The folder now records the claim's id before
    publishing, and finds it in the manifest."""
    tier = _first_sync_killed_at(data_dir, tmp_path, "remote.claim.before_record")
    claimed = RemoteLog(open_object_store(tier), "t", 0).latest()
    assert claimed is not None and claimed.epoch == 1 and claimed.segments == ()
    with Store.open(data_dir) as store:
        [synced] = store.sync_remote()
        assert synced.uploaded and store.remote_status("t", 0).epoch == 1
    assert [message.offset for message in Reader(tier, "t")] == list(range(synced.remote_end_offset))


@pytest.mark.fault
def test_a_claim_killed_before_its_publish_never_takes_another_folders_claim_for_its_own(
        data_dir: Path, tmp_path: Path) -> None:
    """The folder recorded the claim it was making, then died before publishing it; another folder then claimed
    the same epoch. The first must stay fenced: the epoch is the same number, the claim is not its own."""
    tier = _first_sync_killed_at(data_dir, tmp_path, "remote.claim.before_publish")
    assert RemoteLog(open_object_store(tier), "t", 0).latest() is None
    with tiered_store(tmp_path / "standby", tier, ManualClock()) as standby:
        assert standby.claim_remote("t", 0) == 1
    with Store.open(data_dir) as store, pytest.raises(RemoteLogFencedError, match="epoch 1"):
        store.sync_remote()


def test_epoch_records_and_manifests_without_claim_ids_are_still_read(data_dir: Path, tmp_path: Path,
                                                                      clock: ManualClock) -> None:
    """Folders and tiers written before claims had ids: an epoch is then matched by its number alone."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with tiered_store(data_dir, tier, clock) as store:
        produce(store, "t", 100)
        store.sync_remote()
        record = store.partition_log("t", 0).folder / REMOTE_EPOCH_RECORD
        record.write_bytes(encode_record("remote-epoch", 1, {"epoch": 1}))  # as earlier releases wrote it
        produce(store, "t", 100, start=100)
        assert store.sync_remote()[0].uploaded
        log = RemoteLog(open_object_store(tier), "t", 0)
        latest = log.latest()
        assert latest is not None and latest.claim is not None
        assert log.publish(dataclasses.replace(latest, version=latest.version + 1, claim=None))
        produce(store, "t", 100, start=200)
        [synced] = store.sync_remote()
        assert synced.uploaded
        record.write_bytes(b"damaged")
        assert store.claim_remote("t", 0) == 2  # a claim replaces a record that does not read
        assert store.sync_remote()[0].remote_end_offset == synced.remote_end_offset
    assert [message.offset for message in Reader(tier, "t")] == list(range(synced.remote_end_offset))
