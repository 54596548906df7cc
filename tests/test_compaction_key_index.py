"""compaction.key.index: a topic's compacted ledgers may be written without a key index. Readers must see the same
view and get the same answer to every lookup as with one; a view on a remote tier always gets one."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from pyspark.sql.datasource import In

from compactor import Compactor
from compactor.scheduler import CompactionScheduler
from readers import TableView
from storage import Store
from storage.compacted import CompactedLedgers
from storage.config import InvalidConfigError
from storage.key_index import UNINDEXED_MARKER
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog
from storage.verification import verify_topics
from streaming.scan import ScanOptions, TopicScan
from tests.conftest import ManualClock
from tests.test_layered_views import Pair, changes, compacted_rows, cursor_of

UNINDEXED = {"compaction.key.index": "false"}


def index_folders(store: Store, topic: str) -> dict[int, list[str]]:
    """Each ledger of the current view: the names in its key index folder."""
    ledgers = CompactedLedgers(store.partition_log(topic, 0).folder)
    return {ledger_id: sorted(path.name for path in ledgers.ledger_paths(ledger_id)[1].iterdir())
            for ledger_id in cursor_of(store, topic).ledger_ids}


def latest_values(log: list[Pair]) -> dict[bytes, bytes | None]:
    return {key: value for key, value in log if key is not None}


def assert_lookups_follow(store: Store, topic: str, log: list[Pair]) -> None:
    """Every key of the log, and one it never held, gets its latest value (None for a tombstone) from a lookup."""
    latest = latest_values(log)
    with TableView(store, topic) as view:
        for key in [*latest, b"never"]:
            assert view.get(key) == latest.get(key), key


def test_a_view_without_key_index_reads_and_answers_lookups_as_one_with_it(store: Store,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    log = changes(random.Random(5), 3000, keys=400)
    store.create_topic("indexed", config={"segment.bytes": "8192"})
    store.create_topic("unindexed", config={"segment.bytes": "8192", **UNINDEXED})
    for topic in ("indexed", "unindexed"):
        store.append(topic, log, partition=0)
        Compactor(store).compact(topic)
    assert compacted_rows(store, "unindexed") == compacted_rows(store, "indexed")
    [indexed_folder] = index_folders(store, "indexed").values()
    assert any(name.endswith(".sst") for name in indexed_folder)
    assert index_folders(store, "unindexed") == {1: [UNINDEXED_MARKER]}  # no database was written
    assert_lookups_follow(store, "unindexed", log)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]  # no index set aside
    assert verify_topics(store, ["unindexed"], lambda _: None).problems == []


def test_layers_written_with_and_without_a_key_index_answer_lookups_together(store: Store) -> None:
    """The setting changes between runs: a layered view's ledgers then differ, and a lookup still finds each key's
    latest message in whichever layer holds it, and a tombstone or replaced row beneath hides the older one."""
    rng = random.Random(8)
    store.create_topic("t", config={"compaction.max.layers": "8"})
    log = changes(rng, 600, keys=150)
    store.append("t", log, partition=0)
    Compactor(store).compact("t")
    for setting in ("false", "true", "false"):
        store.alter_topic_config("t", {"compaction.key.index": setting})
        batch = changes(rng, 40, keys=150)
        store.append("t", batch, partition=0)
        log += batch
        Compactor(store).compact("t")
        assert_lookups_follow(store, "t", log)
    folders = index_folders(store, "t")
    assert len(folders) == 4  # one layer a run
    assert [names == [UNINDEXED_MARKER] for names in folders.values()] == [False, True, False, True]
    assert verify_topics(store, ["t"], lambda _: None).problems == []


def test_a_bad_setting_is_refused_with_what_is_allowed(store: Store) -> None:
    with pytest.raises(InvalidConfigError, match=r"compaction\.key\.index.*true or false"):
        store.create_topic("t", config={"compaction.key.index": "sometimes"})
    assert store.list_topics() == []


def test_a_view_on_the_remote_tier_always_has_its_key_index(data_dir: Path, s3_uri: str,
                                                             clock: ManualClock) -> None:
    """A view compacted without a key index is not uploaded once the topic turns remote.storage.enable on. Until
    a view is, the tier keeps its whole raw log, which its readers then read (retention would otherwise leave them
    without the keys only the local view holds); the scheduler's next check rewrites the view with an index, with
    nothing new to compact, and that view goes up."""
    log: list[Pair] = [(b"k%03d" % (i % 50), b"v%d" % i) for i in range(500)]
    with Store.open(data_dir, remote=s3_uri, clock=clock) as store:
        store.create_topic("t", config={"segment.bytes": "4096", "file.delete.delay.ms": "0", "retention.ms": "1000",
                                        "compaction.threshold.bytes": "1000000", **UNINDEXED})
        store.append("t", log, partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        assert index_folders(store, "t") == {1: [UNINDEXED_MARKER]}
        store.alter_topic_config("t", {"remote.storage.enable": "true"})
        clock.advance(10_000)
        store.append("t", [(b"new", b"x")], partition=0)
        store.roll("t", 0)
        store.sync_remote()
        store.enforce_retention("t")
        manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
        assert manifest is not None and manifest.compacted is None  # the unindexed view stayed local
        with TableView(s3_uri, "t") as view:  # the tier alone: its raw log, kept whole
            assert [view.get(b"k000"), view.get(b"k049"), view.get(b"new")] == [b"v450", b"v499", b"x"]
        [(_, result)] = CompactionScheduler(store).check_once()  # nothing new above the threshold, yet due
        assert not result.skipped and result.horizon == 500
        assert UNINDEXED_MARKER not in index_folders(store, "t")[result.ledger_id]
        store.sync_remote()
        store.enforce_retention("t")
    manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
    assert manifest is not None and manifest.compacted is not None
    assert manifest.compacted.ledger_id == result.ledger_id and manifest.log_start_offset > 0  # retention went on
    with TableView(s3_uri, "t") as view:
        assert [view.get(b"k000"), view.get(b"k049"), view.get(b"new")] == [b"v450", b"v499", b"x"]


@pytest.mark.parametrize("view", ["compacted", "read_compacted"])
def test_pushed_key_filters_read_a_ledger_without_a_key_index_as_one_with_it(data_dir: Path, view: str) -> None:
    """The scan's key filters (Spark's key = and IN), over a ledger cut into several tasks: each task reads its own
    share of an unindexed ledger and filters it, and the rows are those an indexed ledger's lookups give."""
    # 1,200 keys of 2 KB values: a ledger of three batches (of at most 1 MiB each)
    log: list[Pair] = [(b"k%04d" % (i % 1200), None if i % 7 == 0 else (b"v%d" % i).ljust(2000, b"."))
                       for i in range(3000)]
    with Store.open(data_dir) as store:
        for topic, config in (("indexed", {}), ("unindexed", UNINDEXED)):
            store.create_topic(topic, config=config)
            store.append(topic, log[:2500], partition=0)
            Compactor(store).compact(topic)
            store.append(topic, log[2500:], partition=0)
    keys = (b"k0002", b"k0600", b"k1198", b"never")

    def rows(topic: str) -> list[tuple[int, bytes, bytes | None]]:
        scan = TopicScan(ScanOptions.parse({"path": str(data_dir), "topic": topic, "view": view,
                                            "maxPartitionBytes": "1000000"}))
        assert list(scan.pushFilters([In(("key",), tuple(bytearray(key) for key in keys))])) == []  # pushed
        pieces = list(scan.partitions())
        assert len(pieces) > 2 or view == "read_compacted"  # the table's ledger is cut into tasks
        return sorted((row["offset"], row["key"], row["value"])
                      for piece in pieces for batch in scan.read(piece) for row in batch.to_pylist())

    found = rows("unindexed")
    assert found == rows("indexed")
    assert {key for _, key, _ in found} == set(keys[:3])
