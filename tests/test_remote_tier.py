"""The remote tier (storage/remote_tier.py): sealed segments uploaded to object storage, read from there once their
local copies are gone, expired from there by retention, and published by create-once manifests that fence stale
writers. Against a real S3-protocol server (moto, on 127.0.0.1) and a file:// tier."""

from __future__ import annotations

import shutil
import socket
import struct
import threading
import time
from pathlib import Path

import boto3
import pytest
from kafka import KafkaConsumer, TopicPartition

from compactor import Compactor
from ledgerview.kafka import KafkaEndpoint
from readers import Consumer, Reader, TableView
from storage import Store
from storage.compacted import CompactedLedgers
from storage.config import InvalidConfigError
from storage.errors import CorruptSegmentError, LedgerviewError, OffsetOutOfRangeError
from storage.files import REMOTE_TIER_RECORD
from storage.object_store import RemoteStorageError, open_object_store
from storage.records import CorruptRecordError
from storage.remote_log import RemoteLog, RemoteLogFencedError
from storage.remote_store import RemoteStore
from storage.verification import verify_topics
from streaming.scan import ScanOptions, TopicScan
from tests.conftest import ManualClock
from tests.processes.children import Child

pytestmark = pytest.mark.slow  # an S3 server and many requests per test: after the fast suite

TIERED = {"segment.bytes": "2048", "index.interval.bytes": "256", "remote.storage.enable": "true",
          "local.retention.ms": "0", "file.delete.delay.ms": "0"}
"""Small segments, uploaded and then dropped locally at once: every read of a sealed segment crosses the tier."""
KEYS = 7


def produce(store: Store, topic: str, count: int, start: int = 0) -> None:
    store.append(topic, [(f"k{i % KEYS}", f"v{i}".encode() * 20) for i in range(start, start + count)], partition=0)


def only_remote(store: Store, clock: ManualClock) -> None:
    """Upload every sealed segment of ``t``, then drop the local copies (local.retention.ms=0)."""
    store.sync_remote()
    clock.advance(1)
    store.enforce_retention("t")


@pytest.fixture(params=["s3", "file"])
def remote_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'shared-mount' / 'tier'}"
    return str(request.getfixturevalue("s3_uri"))


def tiered_store(data_dir: Path, remote_uri: str, clock: ManualClock, config: dict[str, str] | None = None) -> Store:
    store = Store.open(data_dir, remote=remote_uri, clock=clock)
    store.create_topic("t", 1, config or TIERED)
    return store


def test_reads_cross_the_tiers_once_local_copies_are_gone(data_dir: Path, remote_uri: str,
                                                          clock: ManualClock) -> None:
    with tiered_store(data_dir, remote_uri, clock) as store:
        produce(store, "t", 200)
        sealed = len(store.partition_log("t", 0).segments) - 1
        [result] = store.sync_remote()
        assert len(result.uploaded) == sealed and result.remote_end_offset == result.uploaded[-1].next_offset
        assert store.sync_remote()[0].uploaded == []  # nothing new to upload
        clock.advance(1)  # local.retention.ms=0: every uploaded segment is now past it
        store.enforce_retention("t")
        log = store.partition_log("t", 0)
        assert len(log.segments) == 1 and len(log.remote_segments) == sealed  # only the active segment is local
        assert log.log_start_offset == 0 and log.size_bytes > log.local_size_bytes
        table = store.read("t", 0, 0)
        assert table.column("offset").to_pylist() == list(range(200))
        assert table.column("value")[150].as_py() == b"v150" * 20
        assert store.read("t", 0, 37, max_messages=3).column("offset").to_pylist() == [37, 38, 39]
        assert store.offset_for_timestamp("t", 0, 0) == 0
    # Reopened without naming the tier: the folder remembers it, so nothing is lost to a caller.
    with Store.open(data_dir, clock=clock) as store:
        assert store.read("t", 0, 0).num_rows == 200
        assert [result.ledger_id for result in Compactor(store).compact("t")] == [1]
        latest = {f"k{i % KEYS}".encode(): f"v{i}".encode() * 20 for i in range(200)}
        view = {message.key: message.value for message in Reader(store, "t", read_compacted=True)}
        assert view == latest
        assert [message.offset for message in Reader(store, "t")] == list(range(200))
        assert TableView(store, "t").get(b"k3") == latest[b"k3"]


def test_a_folder_tiered_to_one_uri_refuses_another(data_dir: Path, remote_uri: str, clock: ManualClock,
                                                    tmp_path: Path) -> None:
    tiered_store(data_dir, remote_uri, clock).close()
    with pytest.raises(LedgerviewError, match="is tiered to"):
        Store.open(data_dir, remote=f"file://{tmp_path / 'elsewhere'}")


def test_a_read_only_open_refuses_another_uri_and_remembers_none(data_dir: Path, clock: ManualClock,
                                                                 tmp_path: Path) -> None:
    tier = f"file://{tmp_path / 'tier'}"
    with tiered_store(data_dir, tier, clock) as store:
        produce(store, "t", 3)
    with pytest.raises(LedgerviewError, match="is tiered to"):
        Store.open(data_dir, remote=f"file://{tmp_path / 'elsewhere'}", read_only=True)
    with Store.open(data_dir, remote=tier, read_only=True) as reader:
        assert reader.remote is not None and reader.end_offset("t", 0) == 3
    untiered = tmp_path / "untiered"
    Store.open(untiered).close()
    with Store.open(untiered, remote=tier, read_only=True) as reader:
        assert reader.remote is not None  # read through, as asked
    assert not (untiered / REMOTE_TIER_RECORD).exists()  # and nothing written


def test_local_retention_keeps_what_is_not_uploaded(data_dir: Path, remote_uri: str, clock: ManualClock) -> None:
    with tiered_store(data_dir, remote_uri, clock) as store:
        produce(store, "t", 200)
        clock.advance(1)
        store.enforce_retention("t")  # nothing uploaded yet: local copies are the only ones
        assert store.partition_log("t", 0).remote_segments == []
        assert len(store.partition_log("t", 0).segments) > 1
        assert store.read("t", 0, 0).num_rows == 200


def test_retention_ms_expires_the_whole_log_remote_segments_first(data_dir: Path, remote_uri: str,
                                                                   clock: ManualClock) -> None:
    config = {**TIERED, "retention.ms": "60000"}
    with tiered_store(data_dir, remote_uri, clock, config) as store:
        store.append("t", [("old", b"x" * 100)] * 60, partition=0)
        store.roll("t", 0)
        old_end = store.end_offset("t", 0)
        clock.advance(120_000)
        store.append("t", [("new", b"y" * 100)] * 60, partition=0)
        only_remote(store, clock)  # drops the local copies of the uploaded segments (the old ones expire too)
        assert store.partition_log("t", 0).log_start_offset == old_end
        # Every message older than retention.ms is gone from both tiers; the newer ones are all readable.
        start = store.start_offset("t", 0)
        assert start == old_end
        assert store.read("t", 0, start).num_rows == 60
        with pytest.raises(OffsetOutOfRangeError):
            store.read("t", 0, 0)
        remote = RemoteLog(open_object_store(remote_uri), "t", 0)
        manifest = remote.latest()
        assert manifest is not None and manifest.log_start_offset == old_end
        assert all(segment.base_offset >= old_end for segment in manifest.segments)
        stems = {info.key.rsplit(".", 1)[0] for info in open_object_store(remote_uri).list("t-0/segments")}
        assert stems == {segment.stem for segment in manifest.segments}  # dropped objects deleted (no delay)


def test_a_stale_writer_is_fenced_and_goes_on_appending_locally(data_dir: Path, remote_uri: str,
                                                                clock: ManualClock, tmp_path: Path) -> None:
    with tiered_store(data_dir, remote_uri, clock) as primary:
        produce(primary, "t", 100)
        primary.sync_remote()
        with tiered_store(tmp_path / "standby", remote_uri, clock) as standby:
            epoch = standby.claim_remote("t", 0)
        assert epoch == 2
        produce(primary, "t", 100, start=100)
        with pytest.raises(RemoteLogFencedError, match="epoch 2"):
            primary.sync_remote()
        assert primary.end_offset("t", 0) == 200  # appends go on locally
        manifest = RemoteLog(open_object_store(remote_uri), "t", 0).latest()
        assert manifest is not None and manifest.epoch == 2 and manifest.end_offset < 100


def test_a_tiered_topic_stays_tiered(data_dir: Path, remote_uri: str, clock: ManualClock) -> None:
    with tiered_store(data_dir, remote_uri, clock) as store, \
            pytest.raises(InvalidConfigError, match="true once a topic is tiered"):
        store.alter_topic_config("t", {"remote.storage.enable": "false"})


def test_of_two_publishes_of_one_version_exactly_one_wins(remote_uri: str) -> None:
    objects = open_object_store(remote_uri)
    assert objects.create("race/00000000000000000001.json", b"first")
    assert not objects.create("race/00000000000000000001.json", b"second")
    assert objects.read("race/00000000000000000001.json").to_pybytes() == b"first"


def test_remote_tier_needs_delete_only_topics(data_dir: Path, remote_uri: str, clock: ManualClock) -> None:
    with Store.open(data_dir, remote=remote_uri, clock=clock) as store, \
            pytest.raises(InvalidConfigError, match=r"in-place cleaning .* stays local-only"):
        store.create_topic("t", 1, {"remote.storage.enable": "true", "cleanup.policy": "compact,delete"})


def test_a_damaged_manifest_is_an_error_naming_it(data_dir: Path, s3_uri: str, clock: ManualClock) -> None:
    with tiered_store(data_dir, s3_uri, clock) as store:
        produce(store, "t", 100)
        only_remote(store, clock)  # reads of sealed segments now need the manifest
    bucket, prefix = s3_uri.removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3")
    key = max(item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/t-0/manifests/")["Contents"])
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[body.index(b'"next_offset": ') + 15] ^= 0x01  # one digit changed: still JSON, no longer what was written
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    with pytest.raises(CorruptRecordError, match=f"{key.rsplit('/', 1)[-1]}.*CRC-32C"):
        Store.open(data_dir, clock=clock).read("t", 0, 0)


def test_a_flipped_byte_in_a_remote_segment_is_an_error_naming_the_object(data_dir: Path, s3_uri: str,
                                                                           clock: ManualClock) -> None:
    with tiered_store(data_dir, s3_uri, clock) as store:
        produce(store, "t", 100)
        only_remote(store, clock)
    bucket, prefix = s3_uri.removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3")
    key = min(item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/t-0/segments/")["Contents"]
              if item["Key"].endswith(".log"))
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    with Store.open(data_dir, clock=clock) as store, pytest.raises(CorruptSegmentError, match=key):
        store.read("t", 0, 0)


@pytest.mark.fault
@pytest.mark.parametrize("point", ["remote.upload.before_log", "remote.upload.before_publish"])
def test_an_upload_killed_before_its_publish_leaves_only_orphans_that_retention_removes(
        data_dir: Path, s3_uri: str, point: str) -> None:
    with Store.open(data_dir, remote=s3_uri) as store:
        store.create_topic("t", 1, {**TIERED, "local.retention.ms": "-2"})
        produce(store, "t", 200)
    with Child("remote_sync.py", data_dir, "sync", crash_at=point) as child:
        code, _, _ = child.finish()
    assert code == -9
    objects = open_object_store(s3_uri)
    assert RemoteLog(objects, "t", 0).latest() is not None  # the claim was published before the upload
    orphans = [info.key for info in objects.list("t-0/segments")]
    assert orphans  # the killed upload's objects, named by no manifest
    with Store.open(data_dir) as store:
        store.enforce_retention("t")
        assert not set(orphans) & {info.key for info in objects.list("t-0/segments")}
        assert store.sync_remote()[0].uploaded  # the next sync uploads under fresh keys
        store.alter_topic_config("t", {"local.retention.ms": "0"})
        store.enforce_retention("t")
        assert store.read("t", 0, 0).column("offset").to_pylist() == list(range(200))


def test_while_the_remote_is_down_appends_go_on_and_the_upload_lag_grows(data_dir: Path, s3_server: object,
                                                                        clock: ManualClock,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.server import ThreadedMotoServer

    own = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    own.start()
    host, port = own.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    boto3.client("s3").create_bucket(Bucket="going-down")
    with tiered_store(data_dir, "s3://going-down/tier", clock) as store:
        produce(store, "t", 100)
        lag = store.remote_upload_lag("t", 0)
        assert lag is not None and lag > 0
        store.sync_remote()
        assert store.remote_upload_lag("t", 0) == 0
        own.stop()
        produce(store, "t", 100, start=100)
        with pytest.raises(RemoteStorageError, match="going-down"):
            store.sync_remote()
        with pytest.raises(RemoteStorageError, match="going-down"):
            store.enforce_retention("t")  # fails before it takes the partition's writer lock
        produce(store, "t", 10, start=200)
        assert store.end_offset("t", 0) == 210 and store.read("t", 0, 0).num_rows == 210
        assert store.remote_upload_lag("t", 0) > 0


def tiered_and_compacted(data_dir: Path, s3_uri: str, clock: ManualClock) -> dict[bytes, bytes | None]:
    """A tiered topic compacted once and then appended to, all of it uploaded; returns each key's latest value."""
    with tiered_store(data_dir, s3_uri, clock, {**TIERED, "compaction.threshold.bytes": "1"}) as store:
        produce(store, "t", 300)
        store.append("t", [("k1", None)], partition=0)  # a tombstone
        store.roll("t", 0)
        [result] = Compactor(store).compact("t")  # the ledger goes to the remote tier too
        produce(store, "t", 40, start=301)
        store.roll("t", 0)
        [synced] = store.sync_remote()
        assert synced.compacted is not None and synced.compacted.ledger_id == result.ledger_id
        clock.advance(1)
        store.enforce_retention("t")
    latest: dict[bytes, bytes | None] = {f"k{i % KEYS}".encode(): f"v{i}".encode() * 20 for i in range(300)}
    latest[b"k1"] = None
    latest.update({f"k{i % KEYS}".encode(): f"v{i}".encode() * 20 for i in range(301, 341)})
    return latest


def test_a_tiered_topic_is_compacted_whole_so_the_remote_tier_gets_each_view(data_dir: Path, s3_uri: str,
                                                                            clock: ManualClock) -> None:
    """The remote tier copies views of one ledger: a tiered topic never gets a layered view. The copy says where
    the tombstones its compactions left out lie, as the local cursor does, for the tier's streaming readers."""
    with tiered_store(data_dir, s3_uri, clock, {**TIERED, "compaction.threshold.bytes": "1"}) as store:
        produce(store, "t", 300)
        store.append("t", [("k3", None)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        produce(store, "t", 5, start=300)  # five keys replaced: a layered view, were the topic not tiered
        store.roll("t", 0)
        [second] = Compactor(store).compact("t")
        cursor = CompactedLedgers(store.partition_log("t", 0).folder).read_cursor()
        assert cursor is not None and cursor.ledger_ids == (second.ledger_id,)
        [synced] = store.sync_remote()
        assert synced.compacted is not None and synced.compacted.ledger_id == second.ledger_id
        tier_cursor = RemoteStore.open(s3_uri).compacted_ledgers("t", 0).read_cursor()
        assert tier_cursor is not None and tier_cursor.dropped_tombstones == cursor.dropped_tombstones == ((300, 300),)


def test_a_machine_without_the_folder_reads_both_views_from_the_remote_tier(data_dir: Path, s3_uri: str,
                                                                            clock: ManualClock) -> None:
    latest = tiered_and_compacted(data_dir, s3_uri, clock)
    with Store.open(data_dir) as local:
        expected_view = [(m.offset, m.key, m.value) for m in Reader(local, "t", read_compacted=True)]
    remote_view = [(m.offset, m.key, m.value) for m in Reader(s3_uri, "t", read_compacted=True)]
    assert remote_view == expected_view  # the ledger, then the raw messages above its horizon
    assert [m.offset for m in Reader(s3_uri, "t")] == list(range(341))
    with TableView(s3_uri, "t") as table:
        assert {key: table.get(key) for key in latest} == latest


def test_a_remote_only_point_lookup_costs_at_most_three_requests(data_dir: Path, s3_uri: str,
                                                                 clock: ManualClock) -> None:
    with tiered_store(data_dir, s3_uri, clock, {**TIERED, "segment.bytes": "65536"}) as store:
        store.append("t", [(f"key{i:05d}", f"v{i}".encode() * 8) for i in range(3000)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")  # 3000 keys: about 94 groups in the key index
    # A cache too small to keep anything: every lookup reads its key-index group and its ledger batch from the tier.
    remote = RemoteStore.open(s3_uri, manifest_max_age_ms=3_600_000, cache_bytes=1)
    keys = [f"key{i:05d}".encode() for i in range(0, 3000, 97)]
    with TableView(remote, "t") as table:
        table.get(keys[0])  # warm-up: the manifest, the key index's directory
        before = remote.objects.requests
        for key in keys:
            assert table.get(key) == f"v{int(key[3:])}".encode() * 8
        spent = remote.objects.requests - before
        assert len(keys) <= spent <= 3 * len(keys)  # each lookup went to the tier, a few ranged reads
        assert table.get(b"absent") is None


def test_a_consumer_needs_the_data_folder(s3_uri: str) -> None:
    with pytest.raises(LedgerviewError, match="keeps its state in a data folder"):
        Consumer(s3_uri, "t", "sub")


def test_of_two_compactors_only_the_current_writer_publishes_remotely(data_dir: Path, s3_uri: str,
                                                                      clock: ManualClock, tmp_path: Path) -> None:
    with tiered_store(data_dir, s3_uri, clock) as primary:
        produce(primary, "t", 200)
        primary.roll("t", 0)
        primary.sync_remote()
    standby_dir = tmp_path / "standby"
    shutil.copytree(data_dir, standby_dir)  # a standby restored from the primary's folder takes over
    with Store.open(standby_dir, clock=clock) as standby:
        standby.claim_remote("t", 0)
    with Store.open(data_dir, clock=clock) as primary, pytest.raises(RemoteLogFencedError):
        Compactor(primary).compact("t")  # compacted locally; the stale writer's ledger never reaches the tier
    remote = RemoteLog(open_object_store(s3_uri), "t", 0)
    manifest = remote.latest()
    assert manifest is not None and manifest.compacted is None
    with Store.open(standby_dir, clock=clock) as standby:
        [result] = Compactor(standby).compact("t")
    manifest = remote.latest()
    assert manifest is not None and manifest.compacted is not None
    assert (manifest.compacted.ledger_id, manifest.compacted.horizon) == (result.ledger_id, 199)


@pytest.mark.fault
def test_a_compaction_killed_before_its_remote_publish_leaves_the_remote_view_as_it_was(data_dir: Path,
                                                                                        s3_uri: str) -> None:
    with Store.open(data_dir, remote=s3_uri) as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 200)
        store.roll("t", 0)
        store.sync_remote()
    with Child("remote_sync.py", data_dir, "compact", crash_at="remote.compacted.before_publish") as child:
        assert child.finish()[0] == -9
    objects = open_object_store(s3_uri)
    manifest = RemoteLog(objects, "t", 0).latest()
    assert manifest is not None and manifest.compacted is None  # readers of the tier see no half-published view
    assert sum(1 for _ in Reader(s3_uri, "t", read_compacted=True)) == 200  # the raw log, whole
    assert [info.key for info in objects.list("t-0/compacted")]  # the killed run's ledger: an orphan
    with Store.open(data_dir) as store:
        store.sync_remote()  # the local compaction finished before the kill: its ledger goes up now
        store.enforce_retention("t")  # and the orphan goes (file.delete.delay.ms=0)
    manifest = RemoteLog(objects, "t", 0).latest()
    assert manifest is not None and manifest.compacted is not None
    assert {info.key for info in objects.list("t-0/compacted")} == set(manifest.compacted.object_keys)
    view = {m.key: m.value for m in Reader(s3_uri, "t", read_compacted=True)}
    assert view == {f"k{i % KEYS}".encode(): f"v{i}".encode() * 20 for i in range(200)}


@pytest.mark.fault
def test_retention_killed_after_its_remote_publish_finishes_on_the_next_run(data_dir: Path, s3_uri: str) -> None:
    with Store.open(data_dir, remote=s3_uri) as store:
        store.create_topic("t", 1, {**TIERED, "retention.bytes": "4096"})
        produce(store, "t", 200)
        store.sync_remote()
    with Child("remote_sync.py", data_dir, "retention", crash_at="remote.retention.after_publish") as child:
        assert child.finish()[0] == -9
    manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
    assert manifest is not None and manifest.log_start_offset > 0  # the remote log moved its start first
    with Store.open(data_dir) as store:
        start = store.start_offset("t", 0)  # the local log has not moved yet: what it holds is read without a gap
        assert store.read("t", 0, start).column("offset").to_pylist() == list(range(start, 200))
        store.enforce_retention("t")  # the next run finishes the job on both tiers
        assert store.start_offset("t", 0) == manifest.log_start_offset
        assert store.read("t", 0, manifest.log_start_offset).column("offset").to_pylist() == list(
            range(manifest.log_start_offset, 200))
    assert [m.offset for m in Reader(s3_uri, "t")] == list(range(manifest.log_start_offset, manifest.end_offset))


def test_a_spark_batch_read_of_a_tiered_folder_covers_the_remote_segments(data_dir: Path, s3_uri: str,
                                                                          clock: ManualClock) -> None:
    with tiered_store(data_dir, s3_uri, clock) as store:
        produce(store, "t", 200)
        only_remote(store, clock)
    scan = TopicScan(ScanOptions.parse({"path": str(data_dir), "topic": "t", "view": "raw",
                                        "maxPartitionBytes": "4096"}))
    pieces = list(scan.partitions())
    assert len(pieces) > 1  # cut over the remote segments as over local ones
    offsets = [row["offset"] for piece in pieces for batch in scan.read(piece) for row in batch.to_pylist()]
    assert offsets == list(range(200))


def test_a_tier_without_a_conditional_create_is_read_only() -> None:
    objects = open_object_store("mock:///tier")  # pyarrow's in-memory filesystem: no create-once
    with pytest.raises(RemoteStorageError, match=r"writes only to s3://, file:// remote tiers"):
        objects.create("t-0/manifests/00000000000000000001.json", b"{}")


def test_a_uri_that_does_not_open_is_never_remembered(data_dir: Path) -> None:
    for bad in ("s3://", "s3://[x", "no-scheme/at-all"):
        with pytest.raises(LedgerviewError, match="Remote tier"):
            Store.open(data_dir, remote=bad)
    with Store.open(data_dir) as store:
        assert store.remote is None  # the folder still opens, untiered


def spark_rows(location: str, view: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """What ``spark.read.format("ledgerview")`` reads at ``location``, planned and read as Spark does (no session)."""
    scan = TopicScan(ScanOptions.parse({"path": location, "topic": "t", "view": view, "maxPartitionBytes": "4096"}))
    return sorted((row["partition"], row["offset"], row["key"], row["value"])
                  for piece in scan.partitions() for batch in scan.read(piece) for row in batch.to_pylist())


def test_spark_reads_the_remote_tier_alone_as_it_reads_the_folder(data_dir: Path, s3_uri: str,
                                                                  clock: ManualClock) -> None:
    latest = tiered_and_compacted(data_dir, s3_uri, clock)
    for view in ("raw", "read_compacted", "compacted"):
        assert spark_rows(s3_uri, view) == spark_rows(str(data_dir), view)
    table = {key: value for _, _, key, value in spark_rows(s3_uri, "compacted")}
    assert table == {key: value for key, value in latest.items() if value is not None}
    with pytest.raises(LedgerviewError, match="takes a data folder"):
        Store.open(s3_uri)


def test_a_remote_that_hangs_fails_the_request_and_appends_go_on(data_dir: Path, clock: ManualClock,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts connections and never answers: each request gives up after the time-out (retried
    three times) with an error naming the object, instead of waiting for ever."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.extend(iter(lambda: silent.accept()[0], None)), daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "y"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    try:
        with Store.open(data_dir, remote="s3://hanging/tier", remote_timeout_s=0.5, clock=clock) as store:
            store.create_topic("t", 1, TIERED)
            produce(store, "t", 100)
            with pytest.raises(RemoteStorageError, match=r"could not \w+ s3://hanging/tier/.*[Tt]ime"):
                store.sync_remote()
            produce(store, "t", 10, start=100)
            assert store.read("t", 0, 0).num_rows == 110
    finally:
        silent.close()
        for connection in accepted:
            connection.close()


def test_kafka_clients_fetch_through_the_tiers(data_dir: Path, s3_uri: str, clock: ManualClock) -> None:
    """kcat's and kafka-python's view: a Fetch of offsets whose local copies are gone is served from the tier."""
    latest = tiered_and_compacted(data_dir, s3_uri, clock)
    with KafkaEndpoint(data_dir, port=0) as endpoint:
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{endpoint.port}", group_id=None,
                                 fetch_max_wait_ms=100, consumer_timeout_ms=5000, request_timeout_ms=20000)
        try:
            raw, view = TopicPartition("t", 0), TopicPartition("t.compacted", 0)
            consumer.assign([raw, view])
            consumer.seek(raw, 0)
            consumer.seek(view, 0)
            records: dict[str, list[tuple[int, bytes | None, bytes | None]]] = {"t": [], "t.compacted": []}
            deadline = time.monotonic() + 60
            while (len(records["t"]) < 341 or not records["t.compacted"]) and time.monotonic() < deadline:
                for part, batch in consumer.poll(timeout_ms=200).items():
                    records[part.topic] += [(r.offset, r.key, r.value) for r in batch]
        finally:
            consumer.close()
    assert [offset for offset, _, _ in records["t"]] == list(range(341))
    with Store.open(data_dir) as store:
        expected = [(m.offset, m.key, m.value) for m in Reader(store, "t", read_compacted=True)]
    assert records["t.compacted"][: len(expected)] == expected
    assert {key: value for _, key, value in expected} == latest


def test_verify_checks_the_remote_log_too(data_dir: Path, s3_uri: str, clock: ManualClock) -> None:
    tiered_and_compacted(data_dir, s3_uri, clock)
    with Store.open(data_dir, clock=clock) as store:
        assert verify_topics(store, ["t"], lambda _: None).problems == []
    bucket, prefix = s3_uri.removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/t-0/segments/")["Contents"]
    logs = sorted(item["Key"] for item in listed if item["Key"].endswith(".log"))
    body = bytearray(s3.get_object(Bucket=bucket, Key=logs[0])["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=logs[0], Body=bytes(body))  # the only copy of those offsets
    s3.delete_object(Bucket=bucket, Key=logs[1])
    with Store.open(data_dir, clock=clock) as store:
        problems = verify_topics(store, ["t"], lambda _: None).problems
    assert any(logs[0] in problem and "CRC-32C" in problem for problem in problems)
    assert any(logs[1] in problem and "the tier holds none" in problem for problem in problems)


def test_a_damaged_remote_key_index_group_never_gives_a_wrong_answer(data_dir: Path, tmp_path: Path,
                                                                     clock: ManualClock) -> None:
    tier = tmp_path / "shared-mount" / "tier"
    with tiered_store(data_dir, f"file://{tier}", clock, {**TIERED, "segment.bytes": "65536"}) as store:
        store.append("t", [(f"key{i:05d}", f"v{i}".encode()) for i in range(300)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        only_remote(store, clock)
    [keys_object] = tier.rglob("*.keys")
    damaged = bytearray(keys_object.read_bytes())
    # The first group (at byte 0): count, count + 1 bounds, the keys, then their offsets (int64, big-endian).
    # Swapping its first two offsets keeps it well-formed: each key would be sent to the other's message.
    count = struct.unpack_from("<I", damaged)[0]
    offsets = 4 + 4 * (count + 1) + struct.unpack_from("<I", damaged, 4 + 4 * count)[0]
    damaged[offsets : offsets + 16] = damaged[offsets + 8 : offsets + 16] + damaged[offsets : offsets + 8]
    keys_object.write_bytes(bytes(damaged))
    with TableView(f"file://{tier}", "t") as table:  # the group fails its CRC-32C: a ledger scan answers
        assert [table.get(f"key{i:05d}".encode()) for i in range(300)] == [f"v{i}".encode() for i in range(300)]
