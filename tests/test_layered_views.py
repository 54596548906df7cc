"""Layered compacted views (storage/ledger_layers.py): a run whose new messages replace few of the view's rows
writes only what changed, over the view's ledgers. Whatever the layers, every reader must see the view a whole
rewrite would give."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from compactor import Compactor
from ledgerview.commands.verify_repair import repair_views
from readers import Reader, TableView
from readers.snapshot import LedgerRemovedError, snapshot_batches
from storage import Store, compacted
from storage.compacted import CompactedLedgers, CompactionCursor
from storage.ledger_layers import CorruptLayerRecordError, LowerLayer, read_layer_record, write_layer_record
from storage.schema import MESSAGE_SCHEMA, STORED_SCHEMA
from storage.verification import verify_topics

Pair = tuple[bytes | None, bytes | None]
Row = tuple[int, bytes | None, bytes | None]


def cursor_of(store: Store, topic: str) -> CompactionCursor:
    cursor = CompactedLedgers(store.partition_log(topic, 0).folder).read_cursor()
    assert cursor is not None
    return cursor


def compacted_rows(store: Store, topic: str, start: int = 0) -> list[Row]:
    with Reader(store, topic, read_compacted=True, start={0: start}) as reader:
        table = pa.Table.from_batches(list(reader.batches()), schema=MESSAGE_SCHEMA)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def view_model(log: list[Pair], *, retain_null_key: bool, start: int = 0) -> list[Row]:
    """The compacted view of a log compacted to its end: each key's latest message unless it is a tombstone
    (keyless messages only when retained), from ``start`` on."""
    latest = {key: offset for offset, (key, _) in enumerate(log) if key is not None}
    kept = {offset for offset in latest.values() if log[offset][1] is not None}
    if retain_null_key:
        kept |= {offset for offset, (key, _) in enumerate(log) if key is None}
    return [(offset, *log[offset]) for offset in sorted(kept) if offset >= start]


def changes(rng: random.Random, count: int, keys: int) -> list[Pair]:
    """Messages over ``keys`` keys: a tenth tombstones, a twentieth keyless."""
    pairs: list[Pair] = []
    for _ in range(count):
        roll = rng.random()
        key = None if roll < 0.05 else b"k%04d" % rng.randrange(keys)
        pairs.append((key, None if key is not None and roll > 0.9 else b"v%d" % rng.randrange(10**6)))
    return pairs


@pytest.mark.parametrize(("retain_null_key", "budget"), [(False, "268435456"), (True, "268435456"), (False, "1024")],
                         ids=["keyless dropped", "keyless kept", "phase one in several runs"])
def test_a_layered_view_reads_as_the_whole_rewrite_of_the_same_log(store: Store, retain_null_key: bool,
                                                                    budget: str) -> None:
    """Rounds that touch a few keys (layered) and rounds that touch most (until a rewrite): after each, the
    layered topic's reads, lookups and reads from any offset equal the model's and the whole-rewrite topic's. With
    the smallest budget, a layered run's phase one finishes its keys in several runs, each marking the view's rows
    its keys replace."""
    rng = random.Random(11)
    config = {"segment.bytes": "4096", "compaction.retain.null.key": str(retain_null_key).lower(),
              "compaction.memory.bytes": budget}
    store.create_topic("layered", config=config)
    store.create_topic("whole", config={**config, "compaction.max.layers": "1"})
    log: list[Pair] = []
    depths = []
    layered_passes = []
    for round_number in range(10):
        batch = changes(rng, 400 if round_number % 4 == 0 else 40, keys=120 if round_number % 4 == 0 else 15)
        for topic in ("layered", "whole"):
            store.append(topic, batch, partition=0)
            [result] = Compactor(store).compact(topic)
            if topic == "layered" and result.layers > 1:
                layered_passes.append(result.passes)
        log += batch
        depths.append(len(cursor_of(store, "layered").ledger_ids))
        assert len(cursor_of(store, "whole").ledger_ids) == 1
        expected = view_model(log, retain_null_key=retain_null_key)
        assert compacted_rows(store, "layered") == compacted_rows(store, "whole") == expected
        start = rng.randrange(len(log))
        assert compacted_rows(store, "layered", start) == view_model(log, retain_null_key=retain_null_key,
                                                                     start=start)
        with TableView(store, "layered") as view:
            latest = {key: value for key, value in log if key is not None}
            for key in [*latest, b"never"]:
                assert view.get(key) == latest.get(key)
        assert cursor_of(store, "layered").messages_kept == cursor_of(store, "whole").messages_kept
    assert max(depths) == 4 and 1 in depths[1:]  # layers were added, up to the limit, and rewritten whole
    assert (max(layered_passes) > 1) == (budget == "1024")


def test_a_layered_run_over_a_layer_of_keyless_rows_only_finds_the_rows_it_replaces(store: Store) -> None:
    """A run whose new messages are all keyless, kept, tops the view with a ledger of keyless rows only; the next
    run tests that ledger's keys (none) against its new keys, which take a word coding with a shared prefix."""
    store.create_topic("t", config={"compaction.retain.null.key": "true"})
    store.append("t", [(b"user-%08d" % i, b"1") for i in range(100)], partition=0)
    Compactor(store).compact("t")
    store.append("t", [(None, b"keyless")] * 3, partition=0)
    Compactor(store).compact("t")
    store.append("t", [(b"user-%08d" % 1, b"2")], partition=0)
    [result] = Compactor(store).compact("t")
    assert result.layers == 3
    rows = compacted_rows(store, "t")
    assert len(rows) == 103 and rows[-1] == (103, b"user-00000001", b"2") and (1, b"user-00000001", b"1") not in rows


def test_keyless_rows_a_view_kept_leave_it_at_a_layered_run_once_the_topic_no_longer_keeps_them(
        store: Store) -> None:
    """compaction.retain.null.key turned off: the next run drops the keyless rows, layered or not, as Pulsar's
    compactor drops keyless messages."""
    for topic in ("layered", "whole"):
        store.create_topic(topic, config={"compaction.retain.null.key": "true",
                                          "compaction.max.layers": "4" if topic == "layered" else "1"})
        store.append(topic, [(b"a", b"1"), (None, b"keyless"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")], partition=0)
        Compactor(store).compact(topic)
        store.alter_topic_config(topic, set={"compaction.retain.null.key": "false"})
        store.append(topic, [(b"a", b"2"), (None, b"new keyless")], partition=0)
        Compactor(store).compact(topic)
    assert cursor_of(store, "layered").lower_layers == (1,)
    assert compacted_rows(store, "layered") == compacted_rows(store, "whole") == [
        (2, b"b", b"1"), (3, b"c", b"1"), (4, b"d", b"1"), (5, b"a", b"2")]
    assert cursor_of(store, "layered").messages_kept == 4


def test_a_view_half_of_whose_rows_are_replaced_is_rewritten_whole(store: Store) -> None:
    store.create_topic("t", config={"compaction.max.layers": "64"})
    compactor = Compactor(store)
    store.append("t", [(b"k%d" % i, b"a") for i in range(100)], partition=0)
    compactor.compact("t")
    store.append("t", [(b"k%d" % i, b"b") for i in range(100)], partition=0)
    compactor.compact("t")  # the first view had nothing deleted: layered over it, which deletes every row
    assert cursor_of(store, "t").lower_layers == (1,)
    store.append("t", [(b"k0", b"c")], partition=0)
    compactor.compact("t")  # 100 of the 200 rows its ledgers hold are deleted: a reader reads twice what it serves
    cursor = cursor_of(store, "t")
    assert cursor.lower_layers == () and cursor.messages_kept == 100
    assert compacted_rows(store, "t")[-1] == (200, b"k0", b"c")


def test_the_replaced_view_stays_readable_until_its_record_is_removed(store: Store) -> None:
    """A reader that planned on the view before a layered publish keeps reading that view (the old rows the new
    layer replaces included), and retention holds the raw data it needs, until the old view's record goes."""
    store.create_topic("t", config={"compaction.threshold.bytes": "1000000000"})
    compactor = Compactor(store)
    store.append("t", [(b"k%d" % i, b"old") for i in range(10)], partition=0)
    compactor.compact("t")
    store.append("t", [(b"k1", b"new"), (b"k2", None)], partition=0)
    compactor.compact("t")
    ledgers = CompactedLedgers(store.partition_log("t", 0).folder)
    assert cursor_of(store, "t").ledger_ids == (1, 2)
    old = ledgers.open_ledger(1)
    assert old is not None
    try:
        rows = pa.Table.from_batches(list(old.read_batches()), schema=STORED_SCHEMA)
        assert rows["value"].to_pylist() == [b"old"] * 10
    finally:
        old.close()
    assert store.retention_hold("t", 0) == 10  # a reader of the old view reads the raw log above its horizon 9
    ledgers.remove_orphans_and_retired(delete_delay_ms=0)
    assert ledgers.open_ledger(1) is None  # its ledger is still read by the new view, but not as a view alone
    assert store.retention_hold("t", 0) == 12
    assert [(offset, value) for offset, _, value in compacted_rows(store, "t")] == [
        (0, b"old"), *((offset, b"old") for offset in range(3, 10)), (10, b"new")]


def test_a_damaged_layer_record_is_an_error_that_verify_names_and_repair_mends(store: Store, data_dir: Path) -> None:
    store.create_topic("t")
    store.append("t", [(b"k%d" % i, b"a") for i in range(50)], partition=0)
    Compactor(store).compact("t")
    store.append("t", [(b"k%d" % i, b"b") for i in range(5)], partition=0)
    Compactor(store).compact("t")
    expected = compacted_rows(store, "t")
    record = CompactedLedgers(store.partition_log("t", 0).folder).layer_record_path(2)
    data = bytearray(record.read_bytes())
    data[data.index(b'"deleted"') + 14] ^= 0x01  # a bit of the deletion vector: a row would come back
    record.write_bytes(bytes(data))
    with pytest.raises(CorruptLayerRecordError, match=r"00000000000000000002\.layers is unreadable: .*CRC-32C"):
        compacted_rows(store, "t")
    report = verify_topics(store, ["t"], lambda _: None)
    assert any("00000000000000000002.layers" in problem for problem in report.problems)
    repaired, not_repaired = repair_views(store, report.damaged_views, report.raw_gaps)
    assert len(repaired) == 1 and not not_repaired
    assert compacted_rows(store, "t") == expected
    assert verify_topics(store, ["t"], lambda _: None).problems == []


def test_a_view_whose_record_is_gone_is_never_opened_as_its_top_ledger_alone(store: Store) -> None:
    """Once a layered view has been replaced and removed, its top ledger may still be read by a later view; a read
    planned on the removed view must fail, not serve that ledger alone (retention no longer holds its tail)."""
    store.create_topic("t", config={"file.delete.delay.ms": "0", "segment.bytes": "1024"})
    ledgers = CompactedLedgers(store.partition_log("t", 0).folder)
    store.append("t", [(b"k%d" % i, b"old") for i in range(10)], partition=0)
    Compactor(store).compact("t")
    store.append("t", [(b"k1", b"new"), (b"new-key", b"x")], partition=0)
    Compactor(store).compact("t")  # layered over ledger 1; view 1's record retired
    store.alter_topic_config("t", set={"compaction.max.layers": "1"})
    store.append("t", [(b"k2", b"newer")], partition=0)
    Compactor(store).compact("t")  # removes view 1's record (delay 0), then rewrites the view whole
    assert cursor_of(store, "t").ledger_ids == (3,)
    assert ledgers.open_ledger(1) is None
    with pytest.raises(LedgerRemovedError):
        list(snapshot_batches(store, "t", 0, store.end_offset("t", 0), pinned=(1, 9)))


def test_a_pinned_read_whose_view_retires_while_it_opens_reads_it(store: Store,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish renames the pinned view's layer record between finding and reading it: the retired record is
    read instead (the view is retiring, not removed)."""
    store.create_topic("t")
    store.append("t", [(b"k%d" % i, b"old") for i in range(10)], partition=0)
    Compactor(store).compact("t")
    real_read = read_layer_record
    published: list[Path] = []

    def publish_first(path: Path) -> list[LowerLayer]:
        if not published:
            published.append(path)
            store.append("t", [(b"k1", b"new")], partition=0)
            Compactor(store).compact("t")  # renames 1.layers to 1.layers.deleted
        return real_read(path)

    monkeypatch.setattr(compacted, "read_layer_record", publish_first)
    rows = [row for batch in snapshot_batches(store, "t", 0, 10, pinned=(1, 9), with_tail=False)
            for row in batch["value"].to_pylist()]
    assert rows == [b"old"] * 10 and published[0].name == f"{1:020d}.layers"


def test_a_layered_topic_that_turns_the_remote_tier_on_is_rewritten_whole_for_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data", remote=f"file://{tmp_path / 'tier'}") as store:
        store.create_topic("t", config={"segment.bytes": "2048"})
        store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(100)], partition=0)
        Compactor(store).compact("t")
        store.append("t", [(b"k1", b"new")], partition=0)
        Compactor(store).compact("t")
        assert cursor_of(store, "t").ledger_ids == (1, 2)
        store.alter_topic_config("t", set={"remote.storage.enable": "true"})
        store.roll("t", 0)
        [result] = Compactor(store).compact("t")  # nothing new, but a tiered topic's view must be one ledger
        assert not result.skipped and result.layers == 1 and result.horizon == 100
        [synced] = store.sync_remote("t")
        assert synced.compacted is not None and synced.compacted.ledger_id == result.ledger_id


def test_a_layered_run_over_keys_of_other_lengths_finds_the_rows_it_replaces(store: Store) -> None:
    """The new messages' keys all have 4 bytes, the view's 4 and 6: phase one's key coding is widened, and the view's
    4-byte keys must still be found replaced (one by a new value, one by a tombstone)."""
    store.create_topic("t")
    store.append("t", [(b"abcd", b"1"), (b"abcdef", b"1"), (b"wxyz", b"1"), (b"uvwxyz", b"1")], partition=0)
    Compactor(store).compact("t")
    store.append("t", [(b"abcd", b"2"), (b"wxyz", None)], partition=0)
    Compactor(store).compact("t")
    assert cursor_of(store, "t").lower_layers == (1,)
    assert compacted_rows(store, "t") == [(1, b"abcdef", b"1"), (3, b"uvwxyz", b"1"), (4, b"abcd", b"2")]
    with TableView(store, "t") as view:
        assert [view.get(key) for key in (b"abcd", b"wxyz", b"abcdef")] == [b"2", None, b"1"]


def test_a_layer_record_that_miscounts_a_ledgers_rows_is_an_error(store: Store) -> None:
    """A record with a valid checksum that does not fit the ledger beneath (restored from another copy, say) must
    not be applied to it row by row."""
    store.create_topic("t")
    store.append("t", [(b"k%d" % i, b"a") for i in range(20)], partition=0)
    Compactor(store).compact("t")
    store.append("t", [(b"k1", b"b")], partition=0)
    Compactor(store).compact("t")
    record = CompactedLedgers(store.partition_log("t", 0).folder).layer_record_path(2)
    [layer] = read_layer_record(record)
    record.unlink()
    write_layer_record(record, [LowerLayer(layer.ledger_id, layer.horizon, np.append(layer.deleted, False))])
    with pytest.raises(CorruptLayerRecordError, match=r"\.layers is unreadable: it counts 21 rows in ledger .*"
                                                      r"00000000000000000001\.ledger"):
        compacted_rows(store, "t")


def test_verify_names_a_missing_layer_record_even_for_a_view_of_one_ledger(store: Store) -> None:
    """This release publishes every ledger with a record; without it, a read pinned to the view could not tell it
    from a removed one, so its loss is a problem, not an earlier release's layout."""
    store.create_topic("t")
    store.append("t", [(b"k%d" % i, b"a") for i in range(5)], partition=0)
    Compactor(store).compact("t")
    assert verify_topics(store, ["t"], lambda _: None).problems == []
    CompactedLedgers(store.partition_log("t", 0).folder).layer_record_path(1).unlink()
    problems = verify_topics(store, ["t"], lambda _: None).problems
    assert len(problems) == 1 and "names ledger 1, published with a layer record, but" in problems[0]
