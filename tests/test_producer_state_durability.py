"""Idempotent producers' state is durable whenever the log is (storage/producer_state.py; the log's hook is
PartitionLog.register_before_fsync): once a flush (flush.messages, the periodic flush_due), a roll or a close has
fsynced a batch's bytes and moved the recovery point past it, a producer-state file naming the batch (the journal,
or a snapshot) was fsynced before them. Otherwise a power loss could keep the batch and lose its journal line, and
the producer's retry after the restart would be stored twice. This carries DESIGN.md's invariant 1 (an append
flushed per the topic's flush policy survives) over to the state that answers retries of it.

A power loss cannot be staged (a kill -9 leaves the page cache to the kernel), so the tests watch the OS: os.fsync
and os.fdatasync are wrapped to record which file each call synced and which batches the producer-state files held
then. Produce requests are kafka-python's, handled by the endpoint's own handler (ledgerview/kafka/produce.py) over
a real Store whose clock the test moves.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka.broker import Broker, EndpointOptions
from ledgerview.kafka.produce import handle_produce
from ledgerview.kafka.protocol import ErrorCode
from storage import Store
from storage.partition_log import PartitionLog
from storage.producer_state import JOURNAL, SNAPSHOT
from tests.conftest import ManualClock

PRODUCER = 7_000_000
VALUE_BYTES = 600


@dataclass(frozen=True)
class Synced:
    """One fsync: the file, and the batches (producer id, first sequence) it named if it was producer state."""

    path: Path
    batches: frozenset[tuple[int, int]]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[Synced]:
    calls: list[Synced] = []

    def recording(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            calls.append(Synced(path, _batches_named(path)))
            real(fd)
        return sync

    for name in ("fsync", "fdatasync"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, recording(getattr(os, name)))
    return calls


def _batches_named(path: Path) -> frozenset[tuple[int, int]]:
    if path.name == JOURNAL:
        bodies = [json.loads(line)["body"] for line in path.read_bytes().split(b"\n")[:-1]]
    elif path.name.startswith(SNAPSHOT):  # write_atomically fsyncs a temporary file, then renames it
        bodies = json.loads(path.read_bytes())["body"]["batches"]
    else:
        return frozenset()
    return frozenset((body["producer_id"], body["first_sequence"]) for body in bodies)


@pytest.fixture
def broker(store: Store) -> Iterator[Broker]:
    broker = Broker(store, EndpointOptions(port=0), 0)
    yield broker
    broker.heavy_work.close()
    broker.sequences.close()


def _produce(broker: Broker, sequence: int, count: int) -> int:
    """One idempotent batch of ``count`` messages from sequence ``sequence``, answered; returns its first offset."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=PRODUCER,
                                        producer_epoch=0, base_sequence=sequence, batch_size=1 << 20)
    for index in range(count):
        builder.append(index, timestamp=None, key=None, value=b"v" * VALUE_BYTES, headers=[])
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(builder.build()))
    request = ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                             topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[data])])
    response = asyncio.run(handle_produce(broker, request, 7))
    assert isinstance(response, ProduceResponse)
    [partition] = response.responses[0].partition_responses
    assert ErrorCode(partition.error_code) is ErrorCode.NONE
    return int(partition.base_offset)


def _synced_before_first_log(synced: list[Synced], folder: Path) -> list[Synced]:
    """What was fsynced before the first fsync of one of ``folder``'s segment logs."""
    for index, call in enumerate(synced):
        if call.path.parent == folder and call.path.name.endswith(".log"):
            return synced[:index]
    raise AssertionError(f"no segment log of {folder} was fsynced; fsynced: {[call.path.name for call in synced]}")


def _assert_state_durable_first(synced: list[Synced], log: PartitionLog, first_sequence: int, last_offset: int) -> (
    None
):
    assert log.recovery_point > last_offset  # the log's bytes of the batch are durable now
    before = _synced_before_first_log(synced, log.folder)
    assert any((PRODUCER, first_sequence) in call.batches for call in before), (
        f"the batch from sequence {first_sequence} was in no producer-state file fsynced before the segment: "
        f"{[call.path.name for call in synced]}")


def test_a_flush_by_flush_messages_syncs_the_journal_first(store: Store, broker: Broker, synced: list[Synced]) -> None:
    store.create_topic("t", partitions=1, config={"flush.messages": "3"})
    _produce(broker, 0, 2)  # below flush.messages: nothing is fsynced for it yet
    synced.clear()
    offset = _produce(broker, 2, 2)
    _assert_state_durable_first(synced, store.partition_log("t", 0), 0, 1)
    _assert_state_durable_first(synced, store.partition_log("t", 0), 2, offset + 1)


def test_the_periodic_flush_syncs_the_journal_first(store: Store, broker: Broker, synced: list[Synced],
                                                    clock: ManualClock) -> None:
    store.create_topic("t", partitions=1, config={"flush.ms": "1000"})
    _produce(broker, 0, 2)
    synced.clear()
    clock.advance(1000)
    assert store.flush_due() == 1
    _assert_state_durable_first(synced, store.partition_log("t", 0), 0, 1)


def test_a_roll_syncs_the_journal_before_sealing(store: Store, broker: Broker, synced: list[Synced]) -> None:
    store.create_topic("t", partitions=1, config={"segment.bytes": str(4 * VALUE_BYTES)})
    _produce(broker, 0, 2)
    synced.clear()
    second = _produce(broker, 2, 2)  # does not fit: the first segment is sealed and the recovery point moves
    assert store.partition_log("t", 0).active.base_offset == second
    _assert_state_durable_first(synced, store.partition_log("t", 0), 0, 1)


def test_closing_the_store_syncs_the_journal_first(store: Store, broker: Broker, synced: list[Synced]) -> None:
    """Store.close flushes what was appended; the endpoint snapshots its producer states before it (a snapshot is
    fsynced), but a state it could not snapshot (a failure is logged and skipped) must not be left behind."""
    store.create_topic("t", partitions=1)
    _produce(broker, 0, 2)
    log = store.partition_log("t", 0)
    synced.clear()
    store.close()
    _assert_state_durable_first(synced, log, 0, 1)


def test_nothing_more_is_fsynced_when_no_batch_was_journaled_since(store: Store, broker: Broker,
                                                                  synced: list[Synced]) -> None:
    store.create_topic("t", partitions=1, config={"flush.messages": "1"})
    _produce(broker, 0, 2)
    synced.clear()
    store.append("t", [{"key": "k", "value": "not idempotent"}], partition=0)
    log = store.partition_log("t", 0)
    assert log.recovery_point == log.end_offset
    assert [call.path.name for call in synced if call.path.name == JOURNAL] == []
