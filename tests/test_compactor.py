"""The two-phase compactor: what the ledger holds, incremental runs, the memory budget, status, triggers, the
retention hold and ledger lifecycle (invariants 3, 4, 5 and 9)."""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from rocksdict import Options, Rdict

from compactor import CompactionInProgressError, CompactionState, Compactor, buckets
from compactor.scheduler import CompactionScheduler
from ledgerview.changelog import ChangelogSpec, generate
from storage import Store
from storage.compacted import CompactedLedgers
from storage.errors import CorruptSegmentError
from storage.files import key_index_folder
from storage.key_index import CorruptKeyIndexError
from storage.schema import STORED_SCHEMA
from tests.conftest import TINY


def ledger_rows(store: Store, topic: str, partition: int = 0) -> list[dict[str, object]]:
    opened = CompactedLedgers(store.partition_log(topic, partition).folder).open_current()
    assert opened is not None
    _, ledger = opened
    try:
        return pa.Table.from_batches(list(ledger.read_batches()), schema=STORED_SCHEMA).to_pylist()
    finally:
        ledger.close()


def latest_live(messages: list[tuple[bytes | None, bytes | None]], *, retain_null_key: bool = False) -> list[int]:
    """Offsets the compacted view must keep: each key's last message unless it is a tombstone."""
    last: dict[bytes, int] = {}
    keyless = []
    for offset, (key, _) in enumerate(messages):
        if key is None:
            keyless.append(offset)
        else:
            last[key] = offset
    kept = [offset for offset in last.values() if messages[offset][1] is not None]
    return sorted(kept + (keyless if retain_null_key else []))


def raw_digest(data_dir: Path, topic: str) -> dict[str, str]:
    files = sorted(p for p in data_dir.glob(f"{topic}-*/*") if p.is_file() and p.suffix in (".log", ".index",
                                                                                              ".timeindex"))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


MESSAGES: list[tuple[bytes | None, bytes | None]] = [
    (b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (None, b"keyless"), (b"b", None), (b"c", b"3"), (b"d", b"4"),
    (b"d", None), (b"d", b"5"),
]


def test_ledger_keeps_each_keys_latest_live_message_with_original_offset_timestamp_and_headers(
    store: Store, data_dir: Path
) -> None:
    store.create_topic("t", config=TINY)
    rows = [{"key": k, "value": v, "timestamp": 1000 + i, "headers": [("n", str(i).encode())]}
            for i, (k, v) in enumerate(MESSAGES)]
    store.append("t", rows, partition=0)
    before = raw_digest(data_dir, "t")
    [result] = Compactor(store).compact("t")
    kept = ledger_rows(store, "t")
    assert [row["offset"] for row in kept] == latest_live(MESSAGES) == [2, 5, 8]
    assert [(row["key"], row["value"], row["timestamp"]) for row in kept] == [
        (b"a", b"2", 1002), (b"c", b"3", 1005), (b"d", b"5", 1008)]
    assert kept[0]["headers"] == [{"key": "n", "value": b"2"}]
    assert (result.horizon, result.messages_read, result.messages_kept, result.messages_removed) == (8, 9, 3, 6)
    assert raw_digest(data_dir, "t") == before  # invariant 3: the raw segments are not touched
    assert store.read("t", 0).num_rows == len(MESSAGES)


def test_keyless_messages_are_kept_when_configured(store: Store) -> None:
    store.create_topic("t", config={"compaction.retain.null.key": "true"})
    store.append("t", MESSAGES, partition=0)
    Compactor(store).compact("t")
    assert [row["offset"] for row in ledger_rows(store, "t")] == latest_live(MESSAGES, retain_null_key=True)


def test_a_second_run_reads_the_previous_ledger_and_only_the_new_tail(store: Store) -> None:
    store.create_topic("t", config=TINY)
    store.append("t", MESSAGES, partition=0)
    compactor = Compactor(store)
    first = compactor.compact("t")[0]
    more: list[tuple[bytes | None, bytes | None]] = [(b"a", None), (b"e", b"6"), (b"c", b"7")]
    store.append("t", more, partition=0)
    second = compactor.compact("t")[0]
    assert second.messages_read == first.messages_kept + len(more)
    assert second.ledger_id != first.ledger_id and second.horizon == len(MESSAGES) + len(more) - 1
    assert [row["offset"] for row in ledger_rows(store, "t")] == latest_live(MESSAGES + more)


def test_a_run_with_nothing_new_keeps_the_ledger(store: Store) -> None:
    store.create_topic("t")
    compactor = Compactor(store)
    assert compactor.compact("t")[0].skipped  # empty topic
    store.append("t", MESSAGES, partition=0)
    first = compactor.compact("t")[0]
    shown = compactor.status("t")[0]
    again = compactor.compact("t")[0]
    assert again.skipped and again.ledger_id == first.ledger_id
    assert (again.messages_read, again.messages_kept, again.messages_removed) == (0, first.messages_kept, 0)
    status = compactor.status("t")[0]  # the run that did the work stays shown
    assert status == shown and status.messages_removed == first.messages_removed


def test_a_key_stays_compacted_when_every_version_is_tombstoned_then_rewritten(store: Store) -> None:
    store.create_topic("t")
    compactor = Compactor(store)
    store.append("t", [(b"k", b"1")], partition=0)
    compactor.compact("t")
    store.append("t", [(b"k", None)], partition=0)
    compactor.compact("t")
    assert ledger_rows(store, "t") == []
    store.append("t", [(b"k", b"2")], partition=0)
    compactor.compact("t")
    assert [(row["offset"], row["value"]) for row in ledger_rows(store, "t")] == [(2, b"2")]


@pytest.mark.parametrize("distribution", ["uniform", "zipf", "zipf-scattered"])
def test_a_small_memory_budget_splits_phase_one_and_gives_the_same_ledger(data_dir: Path, distribution: str) -> None:
    spec = ChangelogSpec(messages=30_000, keys=20_000, value_bytes=8, distribution=distribution, tombstone_share=0.05)
    data = generate(spec)
    ledgers = {}
    for budget in ("100000000", "65536"):
        with Store.open(data_dir / budget) as store:
            store.create_topic("t", config={"compaction.memory.bytes": budget})
            store.append("t", data, partition=0)
            [result] = Compactor(store).compact("t")
            ledgers[budget] = (result.passes, ledger_rows(store, "t"))
    assert ledgers["100000000"][0] == 1 and ledgers["65536"][0] > 4
    assert ledgers["65536"][1] == ledgers["100000000"][1]
    pairs = list(zip(data["key"].to_pylist(), data["value"].to_pylist(), strict=True))
    assert [row["offset"] for row in ledgers["65536"][1]] == latest_live(pairs)


def test_many_messages_over_few_keys_fit_a_small_budget_in_one_run(data_dir: Path) -> None:
    """Too many messages for their pairs to be held at once, but few keys: reducing them is enough, one run."""
    data = generate(ChangelogSpec(messages=30_000, keys=200, value_bytes=8, tombstone_share=0.05))
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"compaction.memory.bytes": str(2 * 1024 * 1024)})
        store.append("t", data, partition=0)
        [result] = Compactor(store).compact("t")
        pairs = list(zip(data["key"].to_pylist(), data["value"].to_pylist(), strict=True))
        assert result.passes == 1
        assert [row["offset"] for row in ledger_rows(store, "t")] == latest_live(pairs)


@pytest.mark.parametrize("key_of", [lambda i: b"k%d" % i, lambda i: b"%06d%06d" % (i * 7919 % 10**6, i)],
                         ids=["binary keys of several lengths", "fixed-width keys without a shared prefix"])
def test_groups_of_repeating_keys_reduced_first_give_the_models_ledger(
        data_dir: Path, key_of: Callable[[int], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase one reduces a group whose keys repeat before cutting it (compactor/buckets.py REPEAT_SHARE), whatever
    the key coding: 60k messages over 300 keys, in several groups at this budget, tombstones and keyless messages
    among them."""
    reduced = []
    keys_repeat = buckets._keys_repeat
    monkeypatch.setattr(buckets, "_keys_repeat", lambda codes: reduced.append(keys_repeat(codes)) or reduced[-1])
    messages: list[tuple[bytes | None, bytes | None]] = [
        (None if i % 97 == 0 else key_of(i % 150 + (150 if i >= 30_000 else 0)), None if i % 11 == 0 else b"v%d" % i)
        for i in range(60_000)]  # half the keys only in the first half: their latest messages are in reduced groups
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"compaction.memory.bytes": str(8 * 1024 * 1024)})
        store.append("t", messages, partition=0)
        Compactor(store).compact("t")
        assert [row["offset"] for row in ledger_rows(store, "t")] == latest_live(messages)
    assert sum(reduced) > 2  # several groups were reduced first (a last one shorter than the sample is not)


def test_the_key_index_of_a_run_split_into_passes_finds_every_live_key(data_dir: Path) -> None:
    """Each pass writes its own sorted run; the ingested index answers every key as the model does, with keys of
    several lengths, zero bytes and the empty key among them."""
    keys = [b"", b"\x00", b"a", b"a\x00", b"\x00a"] + [b"k%d" % i for i in range(3000)]
    messages: list[tuple[bytes | None, bytes | None]] = [
        (keys[(i * 7919) % len(keys)], None if i % 11 == 0 else b"v%d" % i) for i in range(9000)]
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"compaction.memory.bytes": "65536", "segment.bytes": "65536"})
        store.append("t", messages, partition=0)
        [result] = Compactor(store).compact("t")
        assert result.passes > 2
        opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
        assert opened is not None
        _, ledger = opened
        try:
            latest = {key: offset for offset, (key, _) in enumerate(messages) if key is not None}
            for key in keys:
                found = ledger.lookup(key)
                value = messages[latest[key]][1] if key in latest else None
                if value is None:
                    assert found is None and ledger.keys.locate(key) is None
                else:
                    assert found is not None and found.to_pylist()[0]["value"] == value
                    assert ledger.keys.locate(key) == latest[key]
            assert sorted(ledger.keys.keys()) == sorted(k for k, o in latest.items() if messages[o][1] is not None)
        finally:
            ledger.close()


@pytest.mark.parametrize("budget", ["100000000", "65536"])
@pytest.mark.parametrize(("first_key", "later_key"), [(b"k%04d", b"k%d"), (b"user-%08d", b"item-%08d")],
                         ids=["other lengths", "same length, other prefix"])
def test_keys_the_first_coding_refuses_are_grouped_exactly(data_dir: Path, budget: str, first_key: bytes,
                                                           later_key: bytes) -> None:
    """Phase one codes keys by the first batch; a later batch of other lengths, or of the same length but not
    sharing the prefix its word codes leave out, makes it start again with a wider coding (with a small budget,
    while hashing for the split): the ledger is still the model's."""
    first: list[tuple[bytes | None, bytes | None]] = [(first_key % (i % 700), b"v%d" % i) for i in range(3000)]
    later: list[tuple[bytes | None, bytes | None]] = [
        (later_key % (i % 900), None if i % 13 == 0 else b"w%d" % i) for i in range(3000)]
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"compaction.memory.bytes": budget})
        store.append("t", first, partition=0)
        store.append("t", later, partition=0)
        Compactor(store).compact("t")
        assert [row["offset"] for row in ledger_rows(store, "t")] == latest_live(first + later)
        opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
        assert opened is not None
        _, ledger = opened
        try:
            latest = {key: offset for offset, (key, _) in enumerate(first + later)}
            for key in (first_key % 5, later_key % 7, later_key % 13):
                assert ledger.keys.locate(key) == latest[key]
        finally:
            ledger.close()


def test_key_index_finds_each_kept_message(store: Store) -> None:
    store.create_topic("t", config=TINY)
    store.append("t", MESSAGES, partition=0)
    Compactor(store).compact("t")
    opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
    assert opened is not None
    _, ledger = opened
    try:
        found = ledger.lookup(b"d")
        assert found is not None and found.to_pylist()[0]["value"] == b"5"
        assert ledger.lookup(b"b") is None  # tombstoned
        assert ledger.lookup(b"zzz") is None
    finally:
        ledger.close()


@pytest.mark.parametrize(("key", "wrong_offset"), [(b"d", 7), (b"c", 99)],
                         ids=["a tombstone's offset between kept messages", "past the ledger's last message"])
def test_key_index_pointing_at_an_offset_the_ledger_lacks_is_an_error_not_a_neighbour(
        store: Store, key: bytes, wrong_offset: int) -> None:
    """A damaged key index must not hand out another key's message (or an empty row) as ``key``'s."""
    store.create_topic("t", config=TINY)
    store.append("t", MESSAGES, partition=0)
    Compactor(store).compact("t")
    folder = store.partition_log("t", 0).folder
    cursor = CompactedLedgers(folder).read_cursor()
    assert cursor is not None
    _point_key_at(key_index_folder(folder, cursor.ledger_id), key, wrong_offset)
    opened = CompactedLedgers(folder).open_current()
    assert opened is not None
    _, ledger = opened
    try:
        with pytest.raises(CorruptKeyIndexError,
                           match=f"sends the key to offset {wrong_offset}, which ledger .* does not hold"):
            ledger.lookup(key)
        found = ledger.lookup(b"a")  # the undamaged entries still answer
        assert found is not None and found.to_pylist()[0]["offset"] == 2
    finally:
        ledger.close()


def _point_key_at(index_folder: Path, key: bytes, offset: int) -> None:
    """Rewrite ``key``'s offset in its group, as docs/FORMAT.md lays a group out (the index here has one)."""
    index = Rdict(str(index_folder), Options(raw_mode=True))
    try:
        [(entry, group)] = list(index.items())
        count = struct.unpack_from("<I", group)[0]
        bounds = struct.unpack_from(f"<{count + 1}I", group, 4)
        keys_start = 4 + 4 * (count + 1)
        keys = [group[keys_start + bounds[row] : keys_start + bounds[row + 1]] for row in range(count)]
        at = keys_start + bounds[-1] + 8 * keys.index(key)
        index[entry] = group[:at] + struct.pack(">q", offset) + group[at + 8 :]
    finally:
        index.close()


def test_a_second_run_while_one_holds_the_lock_is_refused(store: Store) -> None:
    store.create_topic("t")
    store.append("t", MESSAGES, partition=0)
    folder = store.partition_log("t", 0).folder
    with CompactedLedgers(folder).lock(wait=True), pytest.raises(CompactionInProgressError, match="already running"):
        Compactor(store).compact("t")


def test_status_moves_from_not_run_to_success_and_reports_errors(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t", config=TINY)
        compactor = Compactor(store)
        assert [s.state for s in compactor.status("t")] == [CompactionState.NOT_RUN]
        store.append("t", MESSAGES, partition=0)
        store.append("t", MESSAGES, partition=0)
        compactor.compact("t")
        [status] = compactor.status("t")
        assert (status.state, status.messages_read, status.messages_kept, status.messages_removed) == (
            CompactionState.SUCCESS, 18, 3, 15)
        assert status.started_ms is not None and status.ended_ms is not None
        assert compactor.compact("t")[0].skipped  # nothing new: the last run that did the work stays shown
        assert compactor.status("t") == [status]
    shutil.rmtree(CompactedLedgers(data_dir / "t-0").folder)  # the view given up: the next run reads the raw log
    first = sorted((data_dir / "t-0").glob("*.log"))[0]
    damaged = bytearray(first.read_bytes())
    damaged[100] ^= 0xFF
    first.write_bytes(bytes(damaged))
    with Store.open(data_dir) as store:
        store.append("t", [(b"z", b"9")], partition=0)
        with pytest.raises(CorruptSegmentError, match="Corrupt batch"):
            Compactor(store).compact("t")
        [status] = Compactor(store).status("t")
        assert status.state is CompactionState.ERROR and "Corrupt batch" in (status.last_error or "")


def test_a_corrupt_batch_deep_in_the_log_fails_the_run_through_the_read_ahead(data_dir: Path) -> None:
    """Phase one's first read runs on another thread; a CRC mismatch it finds there is the run's error, named."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        for start in range(0, 40):
            store.append("t", [(b"k%d" % (i % 50), b"v%d" % i) for i in range(start * 100, start * 100 + 100)],
                         partition=0)
    log_file = sorted((data_dir / "t-0").glob("*.log"))[0]
    damaged = bytearray(log_file.read_bytes())
    damaged[len(damaged) * 3 // 4] ^= 0xFF
    log_file.write_bytes(bytes(damaged))
    with Store.open(data_dir) as store, pytest.raises(CorruptSegmentError, match="Corrupt batch"):
        Compactor(store).compact("t")
    assert CompactedLedgers(data_dir / "t-0").read_cursor() is None
    assert not [path for path in (data_dir / "t-0" / "compacted").iterdir() if path.suffix in (".ledger", ".keys")]


def test_the_scheduler_compacts_partitions_past_the_threshold(store: Store) -> None:
    store.create_topic("t", partitions=2, config={"compaction.threshold.bytes": "2000"})
    store.create_topic("manual")  # threshold 0: never compacted automatically
    store.append("manual", [(b"k", b"v" * 5000)], partition=0)
    store.append("t", [(b"k", b"v" * 100)], partition=0)
    store.append("t", [(b"k", b"v" * 3000)], partition=1)
    scheduler = CompactionScheduler(store, interval_s=3600)
    try:
        done = scheduler.check_once()
        assert [(topic, result.partition) for topic, result in done] == [("t", 1)]
        assert scheduler.check_once() == []  # nothing new above the horizon
    finally:
        scheduler.stop()
    assert [s.state for s in Compactor(store).status("manual")] == [CompactionState.NOT_RUN]


def test_raw_data_above_the_horizon_is_held_from_retention(store: Store) -> None:
    store.create_topic("plain")
    store.create_topic("auto", config={"compaction.threshold.bytes": "1000000"})
    assert store.retention_hold("plain", 0) is None
    assert store.retention_hold("auto", 0) == 0
    store.append("plain", MESSAGES, partition=0)
    Compactor(store).compact("plain")
    assert store.retention_hold("plain", 0) == len(MESSAGES)


def test_orphan_ledgers_are_removed_and_retired_ones_after_the_delay(store: Store) -> None:
    store.create_topic("t", config={"file.delete.delay.ms": "60000", "compaction.max.layers": "1"})
    compactor = Compactor(store)
    store.append("t", MESSAGES, partition=0)
    compactor.compact("t")
    ledgers = CompactedLedgers(store.partition_log("t", 0).folder)
    orphan, orphan_index = ledgers.ledger_paths(99)
    orphan.write_bytes(b"")
    orphan_index.mkdir()
    store.append("t", [(b"x", b"1")], partition=0)
    compactor.compact("t")
    names = sorted(p.name for p in ledgers.folder.iterdir() if not p.name.startswith("."))
    assert f"{99:020d}.ledger" not in names and f"{99:020d}.keys" not in names
    assert f"{1:020d}.ledger.deleted" in names  # retired, kept for readers that opened it
    store.append("t", [(b"y", b"1")], partition=0)
    store.alter_topic_config("t", set={"file.delete.delay.ms": "0"})
    compactor.compact("t")
    names = sorted(p.name for p in ledgers.folder.iterdir() if not p.name.startswith("."))
    assert not any(name.startswith(f"{1:020d}") for name in names)
    kept = [row["offset"] for row in ledger_rows(store, "t")]
    assert kept == latest_live([*MESSAGES, (b"x", b"1"), (b"y", b"1")])
