"""compaction.key.index: a topic's compacted ledgers may be written without a key index. Readers must see the same
view and get the same answer to every lookup as with one; a view on a remote tier always gets one."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from compactor import Compactor
from readers import TableView
from storage import Store
from storage.compacted import CompactedLedgers
from storage.config import InvalidConfigError
from storage.key_index import UNINDEXED_MARKER
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog
from storage.verification import verify_topics
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


def test_a_view_on_the_remote_tier_always_has_its_key_index(data_dir: Path, s3_uri: str) -> None:
    """A view compacted without a key index is not uploaded once the topic turns remote.storage.enable on: the
    next run rewrites it with one (nothing new to compact), and that view goes up and answers lookups from the
    tier alone."""
    clock = ManualClock()
    log: list[Pair] = [(b"k%03d" % (i % 50), b"v%d" % i) for i in range(500)]
    with Store.open(data_dir, remote=s3_uri, clock=clock) as store:
        store.create_topic("t", config={"segment.bytes": "4096", "file.delete.delay.ms": "0", **UNINDEXED})
        store.append("t", log, partition=0)
        store.roll("t", 0)
        Compactor(store).compact("t")
        assert index_folders(store, "t") == {1: [UNINDEXED_MARKER]}
        store.alter_topic_config("t", {"remote.storage.enable": "true"})
        store.sync_remote()
        manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
        assert manifest is not None and manifest.compacted is None  # the unindexed view stayed local
        [result] = Compactor(store).compact("t")
        assert not result.skipped and result.horizon == 499
        assert UNINDEXED_MARKER not in index_folders(store, "t")[result.ledger_id]
        store.sync_remote()
    manifest = RemoteLog(open_object_store(s3_uri), "t", 0).latest()
    assert manifest is not None and manifest.compacted is not None
    assert manifest.compacted.ledger_id == result.ledger_id
    with TableView(s3_uri, "t") as view:
        assert [view.get(b"k%03d" % key) for key in (0, 49)] == [b"v450", b"v499"]
