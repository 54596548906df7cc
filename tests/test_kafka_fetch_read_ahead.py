"""Fetch read-ahead: once a Fetch that stopped at its byte budget is written, the endpoint encodes what the
consumer's next Fetch will ask for while the consumer handles this one. A consumer keeps one Fetch in flight, so
without it the endpoint's encoding and the client's decoding take turns (bench/RESULTS.md, issue 19). The
read-ahead takes only room nobody uses in queued.max.request.bytes."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.record import MemoryRecords

from compactor import Compactor
from ledgerview.kafka import fetch, read_ahead
from ledgerview.kafka.batch_cache import EncodedBatchCache
from ledgerview.kafka.fetch_response import PartitionAnswer
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.read_ahead import KeptRead, KeptReads, NextRead
from ledgerview.kafka.record_encoding import encode_batch
from ledgerview.kafka.request_queue import QueuedRequestBytes
from readers.partition_read import open_partition_read
from tests.kafka_support import RawClient, Running, fetch_request, kafka, wait_for

__all__ = ["kafka"]

MiB = 1024 * 1024
Message = tuple[int, bytes | None, bytes | None]


def fetched(client: RawClient, offset: int) -> list[Message]:
    """Partition 0 of ``t`` from ``offset``, one Fetch of at most 1 MiB, as (offset, key, value)."""
    error, _, messages = fetch_answer(client, offset)
    assert error == 0
    return messages


def fetch_answer(client: RawClient, offset: int) -> tuple[int, int, list[Message]]:
    """The error code, log start offset and messages of partition 0 of ``t`` from ``offset`` (at most 1 MiB)."""
    response = client.request(fetch_request("t", offset=offset, max_bytes=MiB), FetchResponse, 11)
    partition = response.responses[0].partitions[0]
    messages: list[Message] = []
    if partition.records:
        records = MemoryRecords(partition.records)
        while (batch := records.next_batch()) is not None:
            messages.extend((record.offset, record.key, record.value) for record in batch)
    return partition.error_code, partition.log_start_offset, messages


def counting_encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first offset of every Kafka batch the endpoint encodes from now on (appended on its thread)."""
    encoded_from: list[int] = []

    def counted(batch: Any, **options: Any) -> Any:
        encoded_from.append(batch.column("offset")[0].as_py())
        return encode_batch(batch, **options)

    monkeypatch.setattr(fetch, "encode_batch", counted)
    return encoded_from


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offset of every partition read the endpoint opens from now on (a Fetch's or a read-ahead's)."""
    read_from: list[int] = []

    def counted_read(*arguments: Any, **options: Any) -> Any:
        read_from.append(arguments[3])
        return open_partition_read(*arguments, **options)

    monkeypatch.setattr(fetch, "open_partition_read", counted_read)
    return read_from


def test_the_next_fetch_is_encoded_before_the_consumer_asks_and_served_as_encoded(
        kafka: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = [(b"k%d" % i, bytes([i % 251]) * 300) for i in range(8_000)]
    kafka.store.create_topic("t")
    for start in range(0, len(stored), 2_000):  # four stored batches of about 0.6 MB
        kafka.store.append("t", stored[start : start + 2_000], partition=0)
    encoded_from = counting_encodings(monkeypatch)
    read_from = counting_reads(monkeypatch)
    client = RawClient(kafka.bootstrap)
    try:
        first = fetched(client, 0)
        resume = first[-1][0] + 1
        assert 0 < resume < len(stored)  # the budget stopped the read part way
        # Nothing is asked, yet the batch the next Fetch starts with gets encoded.
        wait_for(lambda: resume in encoded_from, "the next Fetch's first batch encoded ahead", timeout_seconds=30)
        second = fetched(client, resume)
        wait_for(lambda: second[-1][0] + 1 in read_from, "the third Fetch's read made ahead", timeout_seconds=30)
        reads_of_second, encodings_of_second = read_from.count(resume), encoded_from.count(resume)
        again = fetched(client, 0)  # a seek back: the read made ahead is not what this Fetch asks for
    finally:
        client.close()

    assert first + second == [(offset, key, value) for offset, (key, value) in enumerate(stored)][: len(first + second)]
    assert second[0][0] == resume
    assert again == first
    # The second Fetch was served the read made ahead and its encodings: neither was done again.
    assert reads_of_second == encodings_of_second == 1


def test_a_read_ahead_that_fails_leaves_the_connection_serving(kafka: Running,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    stored = [(b"k%d" % i, bytes([i % 251]) * 300) for i in range(6_000)]
    kafka.store.create_topic("t")
    kafka.store.append("t", stored, partition=0)
    failed: list[int] = []

    def failing_once(*arguments: Any, **options: Any) -> Any:
        if arguments[3] > 0 and not failed:  # the first read ahead: the disk says no
            failed.append(arguments[3])
            raise OSError(24, "Too many open files")
        return open_partition_read(*arguments, **options)

    monkeypatch.setattr(fetch, "open_partition_read", failing_once)
    client = RawClient(kafka.bootstrap)
    try:
        first = fetched(client, 0)
        wait_for(lambda: failed, "the read ahead", timeout_seconds=30)
        second = fetched(client, first[-1][0] + 1)  # on the same connection, read now
    finally:
        client.close()
    assert failed == [first[-1][0] + 1]
    assert first + second == [(offset, key, value) for offset, (key, value) in enumerate(stored)][: len(first + second)]


def test_take_spare_counts_only_spare_room_and_evicts_nothing() -> None:
    async def scenario() -> None:
        pool = QueuedRequestBytes(8 * MiB)  # large requests may fill 7 MiB
        cache = EncodedBatchCache(64 * MiB)
        cache.count_in(pool)
        for number in range(4):
            cache.get_or_encode(("t", 0, False, 0, number, number, 1), lambda: bytes(MiB))
        await pool.reserve(MiB)  # 4 MiB cached, 1 MiB queued: 2 MiB spare
        assert pool.take_spare(MiB, then_cached=MiB)
        assert pool.queued_bytes == 2 * MiB
        assert not pool.take_spare(MiB, then_cached=1)  # 1 MiB left: the cache could not keep it
        assert not pool.take_spare(2 * MiB, then_cached=0)
        assert pool.queued_bytes == 2 * MiB  # nothing counted for what was refused
        assert cache.size_bytes == pool.cached_bytes == 4 * MiB  # and nothing evicted for read-ahead
        pool.release(2 * MiB)

    asyncio.run(scenario())


def test_a_read_made_ahead_is_closed_when_nobody_asks_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "KEEP_SECONDS", 0.01)
    closed: list[str] = []

    async def scenario() -> None:
        kept = KeptReads()
        asked = NextRead("t", 0, 100, MiB, first=True)
        kept.keep(asked, KeptRead(PartitionAnswer(0, ErrorCode.NONE), [lambda: closed.append("asked")], 1))
        kept.keep(NextRead("t", 1, 100, MiB, first=False),
                  KeptRead(PartitionAnswer(1, ErrorCode.NONE), [lambda: closed.append("idle")], 1))
        assert kept.take(NextRead("t", 0, 100, MiB // 2, first=True)) is None  # another budget: not this read
        taken = kept.take(asked)
        assert taken is not None and taken.answer.index == 0 and closed == []  # the taker closes what it took
        await asyncio.sleep(0.1)
        assert closed == ["idle"]  # the read nobody asked for, closed after KEEP_SECONDS

    asyncio.run(scenario())


def test_a_read_made_ahead_is_not_served_once_the_log_start_passed_it(kafka: Running,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stored = [(b"k%d" % i, bytes([i % 251]) * 300) for i in range(8_000)]
    kafka.store.create_topic("t")
    kafka.store.append("t", stored, partition=0)
    read_from = counting_reads(monkeypatch)
    client = RawClient(kafka.bootstrap)
    try:
        resume = fetched(client, 0)[-1][0] + 1
        wait_for(lambda: resume in read_from, "the read ahead", timeout_seconds=30)
        kafka.store.delete_records("t", 0, 6_000)  # DeleteRecords, by another process, past the read's offset
        error, log_start, messages = fetch_answer(client, resume)
    finally:
        client.close()
    assert (error, log_start, messages) == (ErrorCode.OFFSET_OUT_OF_RANGE.value, 6_000, [])


def test_a_topic_created_again_is_never_served_what_was_read_ahead_of_the_old_one(
        kafka: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    def messages(fill: int) -> list[tuple[bytes, bytes]]:
        return [(b"k%d" % i, bytes([fill]) * 300) for i in range(8_000)]

    kafka.store.create_topic("t")
    kafka.store.append("t", messages(1), partition=0)
    read_from = counting_reads(monkeypatch)
    client = RawClient(kafka.bootstrap)
    try:
        resume = fetched(client, 0)[-1][0] + 1
        wait_for(lambda: resume in read_from, "the read ahead", timeout_seconds=30)
        kafka.store.delete_topic("t")  # and created again with as many messages of the same sizes
        kafka.store.create_topic("t")
        kafka.store.append("t", messages(2), partition=0)
        served = fetched(client, resume)
    finally:
        client.close()
    assert served and {value for _, _, value in served} == {bytes([2]) * 300}


def test_a_cleaned_log_with_gaps_is_read_ahead_from_where_the_consumer_asks(
        kafka: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    kafka.store.create_topic("t", config={"cleanup.policy": "compact", "segment.bytes": "65536",
                                          "min.cleanable.dirty.ratio": "0"})
    for start in range(0, 8_000, 200):  # each key twice in a row: cleaning leaves the odd offsets
        kafka.store.append("t", [(b"k%d" % (i // 2), bytes([i % 251]) * 300) for i in range(start, start + 200)],
                           partition=0)
    kafka.store.roll("t", 0)
    kafka.store.append("t", [(b"last", b"v")], partition=0)
    kafka.store.clean("t")
    read_from = counting_reads(monkeypatch)
    client = RawClient(kafka.bootstrap)
    try:
        first = fetched(client, 0)
        assert [offset for offset, _, _ in first[:3]] == [1, 3, 5]
        asked = first[-1][0] + 1  # a gap: the next message is at asked + 1
        wait_for(lambda: asked in read_from, "the read ahead from the offset the consumer asks", timeout_seconds=30)
        second = fetched(client, asked)
    finally:
        client.close()
    assert second[0][0] == asked + 1
    assert read_from.count(asked) == 1  # the Fetch was served the read made ahead


def test_a_topic_created_again_is_not_served_the_old_topics_cached_batches(kafka: Running) -> None:
    """The fetch cache keys batches by offsets and counts: the topic's creation time keeps two topics of one name
    apart (the cache already held this range, as any range a consumer fetched)."""
    kafka.store.create_topic("t")
    kafka.store.append("t", [(b"k%d" % i, b"old") for i in range(100)], partition=0)
    client = RawClient(kafka.bootstrap)
    try:
        assert {value for _, _, value in fetched(client, 0)} == {b"old"}
        kafka.store.delete_topic("t")
        kafka.store.create_topic("t")
        kafka.store.append("t", [(b"k%d" % i, b"new") for i in range(100)], partition=0)
        again = fetched(client, 0)
    finally:
        client.close()
    assert len(again) == 100 and {value for _, _, value in again} == {b"new"}


def test_the_compacted_view_is_encoded_ahead_but_read_again(kafka: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its reads span a ledger a compaction may replace: the Fetch reads again, and finds the batches encoded."""
    stored = [(b"k%d" % i, bytes([i % 251]) * 300) for i in range(8_000)]  # every key once: the view keeps all
    kafka.store.create_topic("t")
    kafka.store.append("t", stored, partition=0)
    Compactor(kafka.store).compact("t")
    encoded_from = counting_encodings(monkeypatch)
    read_from = counting_reads(monkeypatch)
    client = RawClient(kafka.bootstrap)
    try:
        request = functools.partial(fetch_request, "t.compacted", max_bytes=MiB)
        first = client.request(request(offset=0), FetchResponse, 11).responses[0].partitions[0]
        resume = list(MemoryRecords(first.records).next_batch())[-1].offset + 1
        wait_for(lambda: resume in encoded_from, "the compacted view's next batch encoded ahead", timeout_seconds=30)
        second = client.request(request(offset=resume), FetchResponse, 11).responses[0].partitions[0]
    finally:
        client.close()
    batch = MemoryRecords(second.records).next_batch()
    assert second.error_code == 0 and batch is not None
    assert [(record.offset, record.key, record.value) for record in batch][:3] == [
        (offset, *stored[offset]) for offset in range(resume, resume + 3)]
    assert read_from.count(resume) == 2 and encoded_from.count(resume) == 1  # read again, encoded once
