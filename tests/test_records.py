"""The one format of small persisted records (storage/records.py): versioned, checksummed, checked on read, so a
damaged record is an error that names it, never a silently wrong view; records of earlier releases still read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compactor import Compactor
from readers import Reader
from storage import Store
from storage.compacted import CompactedLedgers, CorruptCompactionCursorError
from storage.records import CorruptRecordError, decode_record, encode_record
from storage.topics import TopicMetadata
from storage.verification import verify_topics


def test_a_record_reads_back_and_any_changed_byte_of_its_body_is_caught() -> None:
    data = encode_record("example", 1, {"horizon": 41, "name": "prices"})
    assert decode_record("x.json", data, "example", max_version=1) == (1, {"horizon": 41, "name": "prices"})
    changed = data.replace(b"41", b"47")
    with pytest.raises(CorruptRecordError, match=r"x\.json.*CRC-32C"):
        decode_record("x.json", changed, "example", max_version=1)
    with pytest.raises(CorruptRecordError, match="not JSON"):
        decode_record("x.json", data[: len(data) // 2], "example", max_version=1)
    with pytest.raises(CorruptRecordError, match="is a 'example' record"):
        decode_record("x.json", data, "other", max_version=1)
    with pytest.raises(CorruptRecordError, match="upgrade ledgerview"):
        decode_record("x.json", encode_record("example", 3, {}), "example", max_version=2)


def compacted(store: Store) -> CompactedLedgers:
    store.create_topic("t", 1)
    store.append("t", [("a", "1"), ("b", "2"), ("a", "3")], partition=0)
    Compactor(store).compact("t")
    return CompactedLedgers(store.partition_log("t", 0).folder)


def test_a_damaged_compaction_cursor_is_refused_and_verify_says_not_sound(store: Store) -> None:
    ledgers = compacted(store)
    data = ledgers.cursor_path.read_bytes()
    ledgers.cursor_path.write_bytes(data.replace(b'"horizon": 2', b'"horizon": 1'))
    with pytest.raises(CorruptCompactionCursorError, match="CRC-32C"):
        Reader(store, "t", read_compacted=True).batches()
    report = verify_topics(store, ["t"], lambda _: None)
    assert not report.sound and "CRC-32C" in report.problems[0]


def test_a_cursor_whose_horizon_passes_the_end_offset_is_not_sound(store: Store) -> None:
    ledgers = compacted(store)
    cursor = ledgers.read_cursor()
    assert cursor is not None
    ledgers.publish(replace(cursor, horizon=10))  # well formed, checksummed, and wrong
    report = verify_topics(store, ["t"], lambda _: None)
    assert not report.sound and "at or above the partition's end offset 3" in report.problems[0]


def test_records_of_earlier_releases_still_read(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        ledgers = compacted(store)
        cursor = ledgers.read_cursor()
        metadata_path = data_dir / "__topics" / "t" / "topic.json"
    assert cursor is not None
    legacy_cursor = {"version": 1, **{name: getattr(cursor, name) for name in cursor.__dataclass_fields__}}
    ledgers.cursor_path.write_text(json.dumps(legacy_cursor))
    metadata_path.write_text(json.dumps({"version": 1, "name": "t", "partitions": 1, "config": {},
                                         "created_ms": 1}))
    with Store.open(data_dir) as store:
        assert store.topic_metadata("t") == TopicMetadata("t", 1, {}, 1)
        assert [message.value for message in Reader(store, "t", read_compacted=True)] == [b"2", b"3"]
