"""A bug bash of the remote tier, as an outside checker would run it: damaged, truncated or missing objects in the
bucket, a write whose answer is lost, endpoints and buckets that are wrong, and compacted views whose manifest
disagrees with itself. Against the moto S3 server (tests/s3_server.py) and file:// tiers; each test failed before
the fix it comes with."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
import shutil
import socket
import struct
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from compactor import Compactor
from readers import Reader, TableView
from storage import Store
from storage.codec import BatchFormatError
from storage.errors import CorruptDataError, CorruptLedgerError, UnknownTopicError
from storage.files import REMOTE_TIER_RECORD
from storage.object_store import RemoteStorageError, open_object_store
from storage.remote_key_index import TAIL, FlatKeyIndex, sorted_run_entries, write_flat_key_index
from storage.remote_log import RemoteLog, RemoteLogManifest
from storage.remote_segment import RemoteSegment
from storage.remote_store import RemoteStore
from storage.remote_tier import RemoteLogDivergedError
from tests.cli_runner import run_cli
from tests.conftest import ManualClock
from tests.s3_server import S3Server
from tests.test_remote_tier import TIERED, produce

pytestmark = pytest.mark.slow  # an S3 server and many requests per test: after the fast suite



class S3Relay:
    """A TCP relay to the S3 server; once ``armed``, a subclass acts on the next request it is after
    (``on_request``)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = False
        self.lost = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client = self.listener.accept()[0]
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [client, upstream]
            losing = threading.Event()
            threading.Thread(target=self._requests, args=(client, upstream, losing), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client, losing), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, losing: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if self.on_request(data):
                    losing.set()
                upstream.sendall(data)
        except OSError:
            pass

    def _answers(self, upstream: socket.socket, client: socket.socket, losing: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if losing.is_set():
                    while data.startswith(b"HTTP/1.1 100 "):  # '100 Continue': the client sends the body after it
                        interim, _, data = data.partition(b"\r\n\r\n")
                        client.sendall(interim + b"\r\n\r\n")
                    if data:  # the server answered the conditional PUT: drop the answer and the connection
                        self.lost += 1
                        break
                    continue
                client.sendall(data)
        except OSError:
            pass
        for end in (client, upstream):  # shut down first: close alone would not wake the other thread's recv
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def on_request(self, data: bytes) -> bool:
        """Called with each piece of a request before it goes on; True drops the answer to it and its connection."""
        return False

    def close(self) -> None:
        self.listener.close()
        for end in self._sockets:
            end.close()


class AnswerLosingRelay(S3Relay):
    """Once armed, loses the answer to the next conditional PUT of a manifest: the server made the write, and the
    client sees its connection drop, as when a network loses an answer. The client's SDK then retries the request,
    which the server refuses (the key is taken now)."""

    def on_request(self, data: bytes) -> bool:
        if self.armed and b"/manifests/" in data and b"if-none-match" in data.lower():
            self.armed = False
            return True
        return False


class ListingHoldingRelay(S3Relay):
    """Once armed, holds the next listing of objects whose prefix contains ``marker`` until ``release`` is set
    (``held`` is set meanwhile): what other clients do then happens between the lister's earlier requests and the
    listing, which the server answers after them."""

    def __init__(self, upstream: str, marker: bytes) -> None:
        self.marker, self.held, self.release = marker, threading.Event(), threading.Event()
        super().__init__(upstream)

    def on_request(self, data: bytes) -> bool:
        request_line = data.split(b"\r\n", 1)[0]
        if self.armed and b"list-type=2" in request_line and self.marker in request_line:
            self.armed = False
            self.held.set()
            self.release.wait(timeout=60)
        return False


def test_a_publish_whose_answer_is_lost_keeps_the_remote_log_whole(data_dir: Path, s3_server: S3Server,
                                                                   s3_uri: str, clock: ManualClock,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest was created, but its answer was lost and the SDK's retry was refused (the key is taken): the
    writer must see that the manifest is its own, not that another writer won the version. Taken for a lost race,
    the sync re-applied its segments to its own manifest and restarted the remote log at them, dropping every
    older segment from it (their local copies already gone)."""
    relay = AnswerLosingRelay(s3_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    try:
        with Store.open(data_dir, remote=s3_uri, clock=clock) as store:
            store.create_topic("t", 1, TIERED)
            produce(store, "t", 100)
            store.sync_remote()
            clock.advance(1)
            store.enforce_retention("t")  # offsets below the first sync's end now live on the tier alone
            produce(store, "t", 100, start=100)
            relay.armed = True
            [result] = store.sync_remote()
            assert relay.lost == 1  # the answer to the new manifest's PUT was lost, and the PUT retried
            manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
            assert manifest is not None and manifest.log_start_offset == 0
            assert manifest.end_offset == result.remote_end_offset
            assert store.read("t", 0, 0).column("offset").to_pylist() == list(range(200))
        assert [message.offset for message in Reader(s3_uri, "t")] == list(range(result.remote_end_offset))
    finally:
        relay.close()


def test_of_two_creates_of_the_same_bytes_only_the_first_wins(s3_uri: str) -> None:
    """Reading a refused create back is for a retry of our own write only: two claims made in the same millisecond
    from the same manifest are the same bytes, and both winning would give two folders one epoch."""
    objects = open_object_store(s3_uri)
    assert objects.create("t-0/manifests/00000000000000000001.json", b"the same claim")
    assert not objects.create("t-0/manifests/00000000000000000001.json", b"the same claim")


def compacted_on_a_mount(data_dir: Path, tier: Path, clock: ManualClock) -> None:
    """Topic ``t``: 300 keys, compacted, its ledger and flat key index uploaded to the file:// tier at ``tier``, and
    its local copies gone."""
    with Store.open(data_dir, remote=f"file://{tier}", clock=clock) as store:
        store.create_topic("t", 1, {**TIERED, "segment.bytes": "65536"})
        store.append("t", [(f"key{i:05d}", f"v{i}".encode()) for i in range(300)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        store.sync_remote()
        clock.advance(1)
        store.enforce_retention("t")


@pytest.mark.parametrize("damage", ["cut short", "deleted"])
def test_a_remote_key_index_cut_short_or_gone_never_stops_a_lookup(data_dir: Path, tmp_path: Path,
                                                                  clock: ManualClock, damage: str) -> None:
    """A flat key index object shorter than its manifest says (or gone) is a damaged key index: lookups answer
    from a scan of the ledger, as for a group that fails its CRC. They raised struct.error (or the missing object's
    error) though the ledger holds every answer."""
    tier = tmp_path / "mount" / "tier"
    compacted_on_a_mount(data_dir, tier, clock)
    [keys_object] = tier.rglob("*.keys")
    if damage == "deleted":
        keys_object.unlink()
    else:
        keys_object.write_bytes(keys_object.read_bytes()[:-10])
    with TableView(f"file://{tier}", "t") as table:
        assert [table.get(f"key{i:05d}".encode()) for i in range(300)] == [f"v{i}".encode() for i in range(300)]
        assert table.get(b"absent") is None


@pytest.mark.parametrize("endpoint", ["127.0.0.1:{port}", "localhost:{port}", "http://", "http://127.0.0.1:port"])
def test_an_endpoint_that_is_no_url_is_named_and_nothing_is_remembered(data_dir: Path, s3_server: S3Server,
                                                                       s3_uri: str, endpoint: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_ENDPOINT_URL without its scheme (the commonest slip) or without a host: an error that names the variable
    and the form it takes, from the store, the remote-only reader and the command line alike. It was a bare
    ValueError from boto3, or pyarrow's 'Invalid S3 connection scheme' blamed on the URI."""
    given = endpoint.format(port=s3_server.endpoint.rsplit(":", 1)[1])
    monkeypatch.setenv("AWS_ENDPOINT_URL", given)
    message = f"AWS_ENDPOINT_URL='{given}', is not a URL such as http://host:port"
    with pytest.raises(RemoteStorageError, match=re.escape(message)):
        Store.open(data_dir, remote=s3_uri)
    assert not (data_dir / REMOTE_TIER_RECORD).exists()
    with pytest.raises(RemoteStorageError, match=re.escape(message)):
        RemoteStore.open(s3_uri)
    fresh = data_dir.with_name("fresh")
    result = run_cli(fresh, "--remote", s3_uri, "topics", "create", "t", "--config", "remote.storage.enable=true",
                     check=False)
    assert result.code == 2 and message in result.err and "Traceback" not in result.err
    assert "a remote tier is a URI such as" not in result.err  # the URI is right; the variable is not
    assert not fresh.exists()


@pytest.mark.parametrize("disagreement", ["messages_kept", "horizon", "ledger_bytes"])
def test_a_remote_view_whose_counts_disagree_with_its_batches_is_refused(data_dir: Path, s3_uri: str,
                                                                        clock: ManualClock, disagreement: str) -> None:
    """A manifest (create-once, CRC-checked) whose compacted view says it serves more messages or bytes than its
    batch headers hold, or whose horizon lies below its last batch: a remote-only reader refuses the view, naming
    the manifest, as the local view is refused when its cursor and ledgers disagree; the raw log still reads. It
    was served: a count planned from the manifest that the reader never delivered, or (a horizon too low) raw
    messages above it served again after the ledger's."""
    with Store.open(data_dir, remote=s3_uri, clock=clock) as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 200)
        store.roll("t", 0)
        Compactor(store).compact("t")
        store.sync_remote()
    log = RemoteLog(open_object_store(s3_uri), "t", 0)
    manifest = log.latest()
    assert manifest is not None and manifest.compacted is not None
    view = manifest.compacted
    wrong = {"messages_kept": dataclasses.replace(view, messages_kept=view.messages_kept + 1),
             "horizon": dataclasses.replace(view, horizon=view.batches[-1][0] - 1),
             "ledger_bytes": dataclasses.replace(view, ledger_bytes=view.ledger_bytes - 1)}[disagreement]
    assert log.publish(dataclasses.replace(manifest, version=manifest.version + 1, compacted=wrong))
    manifest_url = open_object_store(s3_uri).url(log.manifest_key(manifest.version + 1))
    with pytest.raises(CorruptDataError, match=re.escape(f"The compacted view that {manifest_url} names does not "
                                                         "match its ledger")):
        list(Reader(s3_uri, "t", read_compacted=True))
    reason = {"messages_kept": "the view serves", "horizon": "above its horizon",
              "ledger_bytes": "the ledger holds"}[disagreement]
    with pytest.raises(CorruptDataError, match=reason), TableView(s3_uri, "t") as table:
        table.get(b"k3")
    assert [message.offset for message in Reader(s3_uri, "t")] == list(range(200))


def test_a_reader_of_a_bucket_or_mount_that_does_not_exist_is_told_so(s3_server: S3Server, tmp_path: Path) -> None:
    """A remote-only reader given a bucket that does not exist (a typo, another endpoint), or a file:// tier whose
    mount is not there, is told that, naming the bucket and the endpoint or the folder; it was told 'Unknown topic
    't'. Topics in this store: none.', as if the tier were empty."""
    with pytest.raises(RemoteStorageError, match=re.escape(
            f"the bucket 'no-such-bucket' does not exist at {s3_server.endpoint} (AWS_ENDPOINT_URL)")):
        list(Reader("s3://no-such-bucket/tier", "t"))
    with pytest.raises(RemoteStorageError, match="the bucket 'no-such-bucket' does not exist"):
        TableView("s3://no-such-bucket/tier", "t").get(b"k")
    unmounted = tmp_path / "unmounted" / "tier"
    with pytest.raises(RemoteStorageError, match=re.escape(f"the tier's folder {unmounted} does not exist")):
        list(Reader(f"file://{unmounted}", "t"))


def test_a_topic_missing_from_a_tier_that_exists_is_still_an_unknown_topic(s3_uri: str) -> None:
    with pytest.raises(UnknownTopicError):
        list(Reader(s3_uri, "t"))


def test_credentials_the_server_refuses_are_named_as_such(data_dir: Path, s3_server: S3Server, s3_uri: str,
                                                         clock: ManualClock) -> None:
    """With moto checking signatures (its reset-auth switch), the test's keys are unknown to it: every request is
    refused. The error names the object, and says the credentials were refused and which variables give them; a
    remote-only reader was told only 'AWS Error ACCESS_DENIED during HeadObject operation: No response body..'."""
    with Store.open(data_dir, remote=s3_uri, clock=clock) as store:
        store.create_topic("t", 1, TIERED)
        produce(store, "t", 100)
        store.sync_remote()
    hint = "the credentials were refused or missing: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    set_moto_auth(s3_server, after_requests="0")
    try:
        with pytest.raises(RemoteStorageError, match=f"could not read {re.escape(s3_uri)}/.*{hint}"):
            list(Reader(s3_uri, "t"))
        with Store.open(data_dir, clock=clock) as store:
            produce(store, "t", 100, start=100)
            with pytest.raises(RemoteStorageError, match=f"could not \\w+ {re.escape(s3_uri)}/.*{hint}"):
                store.sync_remote()
            assert store.read("t", 0, 100).num_rows == 100  # appends go on locally
    finally:
        set_moto_auth(s3_server, after_requests="inf")


def set_moto_auth(server: S3Server, *, after_requests: str) -> None:
    """moto checks the signatures and keys of requests once this many have been made since (it starts at inf)."""
    request = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=after_requests.encode(),
                                     headers={"Content-Type": "text/plain"}, method="POST")
    urllib.request.urlopen(request, timeout=10).close()


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_a_remote_segment_whose_index_object_is_gone_is_still_read(data_dir: Path, tmp_path: Path,
                                                                    clock: ManualClock, suffix: str) -> None:
    """A segment's index objects only speed up reads, as a damaged index does: one the tier no longer holds makes
    reads scan the segment from its first batch. It made every read of the segment fail, its log intact."""
    tier = tmp_path / "mount" / "tier"
    with Store.open(data_dir, remote=f"file://{tier}", clock=clock) as store:
        store.create_topic("t", 1, TIERED)
        for i in range(100):
            clock.advance(10)
            produce(store, "t", 1, start=i)
        store.sync_remote()
        clock.advance(1)
        store.enforce_retention("t")
    for index in tier.rglob(f"*{suffix}"):
        index.unlink()
    with Store.open(data_dir, clock=clock) as store:
        assert store.read("t", 0, 0).column("offset").to_pylist() == list(range(100))
        assert store.read("t", 0, 37, max_messages=2).column("offset").to_pylist() == [37, 38]
        stamps = store.read("t", 0, 0).column("timestamp").to_pylist()
        assert store.offset_for_timestamp("t", 0, stamps[41]) == 41
    assert [message.offset for message in Reader(f"file://{tier}", "t")][:3] == [0, 1, 2]


def upload_topic(data_dir: Path, tier: Path, clock: ManualClock, *, segment_bytes: int, messages: int,
                 per_append: int) -> None:
    """Topic t of ``messages`` 1 KiB messages in segments of ``segment_bytes``, all uploaded to ``tier``."""
    with Store.open(data_dir, remote=f"file://{tier}", clock=clock) as store:
        store.create_topic("t", 1, {**TIERED, "segment.bytes": str(segment_bytes)})
        for start in range(0, messages, per_append):
            store.append("t", [(f"k{i}", bytes(1024)) for i in range(start, start + per_append)], partition=0)
        store.sync_remote()


def two_remote_segments(data_dir: Path, tier: Path, clock: ManualClock) -> tuple[RemoteStore, RemoteSegment,
                                                                                  RemoteSegment]:
    """A topic of a few 64 KiB segments uploaded to ``tier``, read through a cache that holds one segment: the
    reader and the first two segments."""
    segment_bytes = 64 * 1024
    upload_topic(data_dir, tier, clock, segment_bytes=segment_bytes, messages=300, per_append=10)
    remote = RemoteStore.open(f"file://{tier}", cache_bytes=segment_bytes)
    first, second = remote.segments("t", 0)[:2]
    return remote, first, second


def read_segment(remote: RemoteStore, segment: RemoteSegment) -> int:
    return sum(batch.num_rows for batch in remote.read_batches("t", 0, segment.base_offset, segment.next_offset))


def damage_on_the_tier(tier: Path, segment: RemoteSegment) -> None:
    damaged = tier / segment.info.log_key
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))


def test_a_remote_segment_fetched_again_has_its_crcs_checked_again(data_dir: Path, tmp_path: Path,
                                                                    clock: ManualClock) -> None:
    """A segment read (and checked) once, then dropped from the fetch cache and damaged on the tier, is checked
    again at its next fetch: the damage is an error, never the damaged bytes served."""
    tier = tmp_path / "mount" / "tier"
    remote, first, second = two_remote_segments(data_dir, tier, clock)
    assert read_segment(remote, first) == first.next_offset
    read_segment(remote, second)  # the first is dropped from the cache
    damage_on_the_tier(tier, first)
    with pytest.raises(CorruptDataError, match=first.info.log_key):
        read_segment(remote, first)


def test_a_read_begun_before_its_segment_was_fetched_again_records_nothing_of_the_new_bytes(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """Reader A reads a remote segment's batches one by one; meanwhile the segment leaves the cache and reader B
    fetches it again, damaged. A goes on over the bytes it fetched and checked; what it checked must not count for
    the new bytes, or reader C would be served the damage."""
    tier = tmp_path / "mount" / "tier"
    remote, first, second = two_remote_segments(data_dir, tier, clock)
    reader_a = first.read_batches(first.base_offset, first.next_offset, verify=True)
    next(reader_a)
    read_segment(remote, second)  # the first is dropped from the cache
    damage_on_the_tier(tier, first)
    with pytest.raises(CorruptDataError, match=first.info.log_key):
        read_segment(remote, first)  # reader B fetches it again
    assert sum(batch.num_rows for batch in reader_a) > 0  # A finishes over its own fetch, which is sound
    with pytest.raises(CorruptDataError, match=first.info.log_key):
        read_segment(remote, first)  # reader C


def test_bytes_a_read_took_before_its_segment_was_fetched_again_are_all_checked(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """A read takes a segment's bytes (a fetch that came damaged); before it scans them, the segment is fetched
    again, sound, and checked whole. What was checked is true of the new fetch, not of the bytes the read took: its
    scan checks them all and finds the damage."""
    tier = tmp_path / "mount" / "tier"
    remote, first, second = two_remote_segments(data_dir, tier, clock)
    sound = (tier / first.info.log_key).read_bytes()
    damage_on_the_tier(tier, first)
    taken = first.take_bytes()
    (tier / first.info.log_key).write_bytes(sound)
    read_segment(remote, second)  # the first is dropped from the cache
    assert read_segment(remote, first) == first.next_offset - first.base_offset  # fetched again, checked whole
    with pytest.raises(BatchFormatError, match="CRC"):
        list(first.scan(0, verify=True, taken=taken))


def test_prefetched_segments_nobody_reads_are_held_within_the_cache(data_dir: Path, tmp_path: Path,
                                                                      clock: ManualClock) -> None:
    """Each read of a remote segment prefetches the next one; a read that stops inside its segment (a point read,
    a fetch with a message limit) never collects it. Such prefetches were held outside the cache's capacity until
    that segment was read, so a long-lived reader's memory grew by a segment per such read; they are cache
    entries now, dropped as any other once past the capacity."""
    tier = tmp_path / "mount" / "tier"
    segment_bytes = 256 * 1024
    upload_topic(data_dir, tier, clock, segment_bytes=segment_bytes, messages=6000, per_append=100)
    remote = RemoteStore.open(f"file://{tier}", cache_bytes=2 * segment_bytes)
    segments = remote.segments("t", 0)
    assert len(segments) > 20
    gc.collect()
    before = pa.total_allocated_bytes()
    for segment in segments[:-1:2]:  # a read from the start of every other one that stops at its first batch
        batches = remote.read_batches("t", 0, segment.base_offset)
        assert next(batches).column("offset")[0].as_py() == segment.base_offset  # the next segment is prefetched
        batches.close()
    remote.cache.prefetch("drain", lambda: pa.py_buffer(b""))  # queued after every prefetch: wait for them
    remote.cache.get("drain", lambda: pa.py_buffer(b""))
    gc.collect()
    held = pa.total_allocated_bytes() - before
    assert held <= 4 * segment_bytes, f"{held} bytes held after reads of {len(segments)} segments"


def restored_from_an_older_copy(data_dir: Path, tmp_path: Path, clock: ManualClock, *,
                                partitions: int = 1) -> tuple[str, RemoteLogManifest]:
    """A data folder of tiered topic t put back from a copy older than its remote log, then appended to: the next
    sealed segment of t-0 starts below the remote log's end. Returns the tier and its manifest of t-0 before."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with Store.open(data_dir, remote=tier, clock=clock) as store:
        store.create_topic("t", partitions, TIERED)
        produce(store, "t", 100)
        store.sync_remote()
    backup = tmp_path / "backup"
    shutil.copytree(data_dir, backup)
    with Store.open(data_dir, clock=clock) as store:
        produce(store, "t", 100, start=100)
        store.sync_remote()
    before = RemoteLog(open_object_store(tier), "t", 0).latest()
    assert before is not None and before.log_start_offset == 0
    shutil.rmtree(data_dir)
    shutil.copytree(backup, data_dir)
    with Store.open(data_dir, clock=clock) as store:
        store.append("t", [(f"k{i}", b"other" * 90) for i in range(100, 400)], partition=0)  # other rolls
        sealed = store.partition_log("t", 0).segments[:-1]
        assert any(s.base_offset < before.end_offset < s.next_offset for s in sealed)  # one spans the remote end
    return tier, before


def test_a_folder_restored_from_an_older_copy_never_cuts_the_remote_log(data_dir: Path, tmp_path: Path,
                                                                         clock: ManualClock) -> None:
    """The sync refuses, naming the divergence, and the remote log keeps every segment. It restarted the remote log
    at the diverging segment, dropping offsets 0 up to it from the tier (and, by local retention, from the
    folder)."""
    tier, before = restored_from_an_older_copy(data_dir, tmp_path, clock)
    with Store.open(data_dir, clock=clock) as store, pytest.raises(
            RemoteLogDivergedError, match=f"starts below the remote log's end {before.end_offset}"):
        store.sync_remote()
    assert RemoteLog(open_object_store(tier), "t", 0).latest() == before
    assert [message.offset for message in Reader(tier, "t")] == list(range(before.end_offset))


def test_remote_sync_names_a_diverged_partition_uploads_the_others_and_exits_as_a_conflict(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """Partition t-0 diverged; t-1 and topic u upload, and `remote sync` counts them. The refusal stopped the rest
    of the command (exit 5), then the rest of its topic (t-1 never tiered, on every run of the service too)."""
    tier, before = restored_from_an_older_copy(data_dir, tmp_path, clock, partitions=2)
    with Store.open(data_dir, clock=clock) as store:
        store.append("t", [(f"k{i}", b"one" * 90) for i in range(300)], partition=1)
        store.create_topic("u", 1, TIERED)
        produce(store, "u", 100)
    synced = run_cli(data_dir, "remote", "sync", "--json", check=False)
    assert synced.code == 4, synced.err
    assert "The local log of t-0 no longer continues its remote log" in synced.err
    assert "from 2 partition(s) of 2 tiered topic(s)" in synced.err
    assert sorted((line["topic"], line["partition"]) for line in synced.json_lines()) == [("t", 1), ("u", 0)]
    assert all(line["uploaded"] for line in synced.json_lines())
    for topic, partition in (("t", 1), ("u", 0)):
        uploaded = RemoteLog(open_object_store(tier), topic, partition).latest()
        assert uploaded is not None and uploaded.end_offset > 0
    assert RemoteLog(open_object_store(tier), "t", 0).latest() == before


@pytest.mark.parametrize("verify_reads", [True, False])
def test_a_remote_ledger_cut_short_is_an_error_naming_it(data_dir: Path, tmp_path: Path, clock: ManualClock,
                                                         verify_reads: bool) -> None:
    """A compacted ledger object shorter than its manifest's batches: the reader names the object and says it is cut
    short. Without CRC checks it raised pyarrow's 'buffer slice would exceed buffer length'; with them it blamed a
    CRC-32C mismatch."""
    tier = tmp_path / "mount" / "tier"
    compacted_on_a_mount(data_dir, tier, clock)
    [ledger] = tier.rglob("*.ledger")
    ledger.write_bytes(ledger.read_bytes()[:-100])
    remote = RemoteStore.open(f"file://{tier}", verify_reads=verify_reads)
    message = f"{re.escape(f'file://{ledger}')} .*it is cut short"
    with pytest.raises(CorruptLedgerError, match=message) as raised:
        list(Reader(remote, "t", read_compacted=True))
    assert "Compact the topic again" in str(raised.value) and "verify --repair" not in str(raised.value)
    with pytest.raises(CorruptLedgerError, match=message), TableView(remote, "t") as table:
        table.get(b"key00299")


def test_a_damaged_first_key_in_a_remote_key_index_directory_never_gives_a_wrong_answer(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """The directory of a flat key index names each group's first key; one flipped there sends lookups to the wrong
    group, which answered that the key is absent (a wrong None from TableView.get for a key the view holds). The
    directory has its own CRC-32C now: the key index is set aside and lookups answer from a scan of the ledger."""
    tier = tmp_path / "mount" / "tier"
    compacted_on_a_mount(data_dir, tier, clock)
    [keys_object] = tier.rglob("*.keys")
    damaged = bytearray(keys_object.read_bytes())
    first_entry = damaged.rfind(b"\x00\x00key00000")  # the directory's first entry: run 0, then the first key
    assert first_entry > 0
    damaged[first_entry + 2 + 3] ^= 0x09  # 'key00000' becomes 'key90000': its keys seem to come before any group
    keys_object.write_bytes(bytes(damaged))
    with TableView(f"file://{tier}", "t") as table:
        assert [table.get(f"key{i:05d}".encode()) for i in range(300)] == [f"v{i}".encode() for i in range(300)]


def test_a_flat_key_index_of_the_previous_version_is_still_read(tmp_path: Path) -> None:
    """Objects written before the directory had its CRC-32C (tail LVKEYS02) answer lookups as before."""
    keys = pa.array([f"key{i:05d}".encode() for i in range(300)], pa.binary())
    path = tmp_path / "index.keys"
    size = write_flat_key_index(sorted_run_entries(keys, np.arange(300, dtype=np.int64) * 2), path)
    start, groups, _, magic = TAIL.unpack(path.read_bytes()[-TAIL.size :])
    assert magic == b"LVKEYS03"
    previous = path.read_bytes()[: size - TAIL.size] + struct.pack("<QI8s", start, groups, b"LVKEYS02")
    index = FlatKeyIndex(str(path), len(previous), lambda position, length: pa.py_buffer(
        previous[position : position + length]))
    assert [index.locate(f"key{i:05d}".encode()) for i in range(300)] == [2 * i for i in range(300)]
    assert index.locate(b"absent") is None


def test_a_damaged_older_manifest_is_swept_and_never_stops_retention(data_dir: Path, tmp_path: Path,
                                                                     clock: ManualClock) -> None:
    """A flipped byte in a manifest a newer one replaced: nothing needs it (readers read the newest, and the grace
    period of those that planned on it has passed), so the sweep removes it, warning. It raised on every retention
    run instead, and stopped retention before the topic's later partitions."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    config = {**TIERED, "file.delete.delay.ms": "60000"}
    with Store.open(data_dir, remote=tier, clock=clock) as store:
        store.create_topic("t", 2, config)
        for _ in range(3):
            for partition in range(2):
                store.append("t", [(f"k{i}", b"v" * 200) for i in range(30)], partition=partition)
            store.sync_remote()
        objects = open_object_store(tier)
        logs = [RemoteLog(objects, "t", partition) for partition in range(2)]
        counts = [len(log._manifest_versions()) for log in logs]
        assert min(counts) >= 3
        oldest = tier.removeprefix("file://") + "/" + logs[0].manifest_key(logs[0]._manifest_versions()[0])
        damaged = bytearray(Path(oldest).read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        Path(oldest).write_bytes(bytes(damaged))
        clock.advance(120_000)
        store.enforce_retention("t")
        assert [len(log._manifest_versions()) for log in logs] == [1, 1]
        assert not Path(oldest).exists()
        newest = [log.latest() for log in logs]
    for partition, manifest in enumerate(newest):
        assert manifest is not None
        assert [m.offset for m in Reader(tier, "t") if m.partition == partition] == list(
            range(manifest.log_start_offset, manifest.end_offset))


def test_a_ledger_a_newer_compaction_replaced_stays_readable_from_the_tier_for_its_grace_period(
        data_dir: Path, tmp_path: Path, clock: ManualClock) -> None:
    """A Spark read_compacted task reads the ledger its query planned on; a compaction publishing meanwhile must not
    fail it, as a data folder keeps a retired ledger for file.delete.delay.ms. On the tier the replaced ledger was
    gone at once (open_ledger answered None), so every such task failed with LedgerRemovedError."""
    tier = f"file://{tmp_path / 'mount' / 'tier'}"
    with Store.open(data_dir, remote=tier, clock=clock) as store:
        store.create_topic("t", 1, {**TIERED, "segment.bytes": "65536", "file.delete.delay.ms": "60000"})
        store.append("t", [(f"key{i:05d}", f"v{i}".encode()) for i in range(300)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        store.sync_remote()
        planned = RemoteStore.open(tier).compacted_ledgers("t", 0).read_cursor()
        assert planned is not None
        first = Reader(tier, "t", read_compacted=True)
        before = [(m.offset, m.key, m.value) for m in first]
        store.append("t", [(f"key{i:05d}", b"new") for i in range(150)], partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        store.sync_remote()
    remote = RemoteStore.open(tier).compacted_ledgers("t", 0)
    current = remote.read_cursor()
    assert current is not None and current.ledger_id > planned.ledger_id
    replaced = remote.open_ledger(planned.ledger_id)
    assert replaced is not None
    try:
        assert [(o, k, v) for batch in replaced.read_batches() for o, k, v in zip(
            batch.column("offset").to_pylist(), batch.column("key").to_pylist(), batch.column("value").to_pylist(),
            strict=True)] == before
    finally:
        replaced.close()
    assert remote.open_ledger(planned.ledger_id + 5) is None
