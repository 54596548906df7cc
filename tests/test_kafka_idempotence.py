"""Idempotent producers' state on disk (storage/producer_state.py through the Kafka endpoint): a retried batch is
answered with its first offset and stored once, also after the endpoint restarted; an out-of-order sequence and
an older epoch get Kafka's errors; a journal line of a batch a crash stopped before it was written is dropped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.protocol import ErrorCode
from storage import Store
from storage.producer_state import JOURNAL, SNAPSHOT, ProducerBatch, ProducerState, Verdict
from tests.kafka_support import RawClient

PRODUCER = 7_000_000


@contextmanager
def _client(data: Path) -> Iterator[RawClient]:
    with KafkaEndpoint(data, port=0) as endpoint:
        client = RawClient(f"127.0.0.1:{endpoint.port}")
        try:
            yield client
        finally:
            client.close()


def _batch(sequence: int, count: int, *, epoch: int = 0, producer_id: int = PRODUCER) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20)
    for index in range(count):
        builder.append(index, timestamp=None, key=None, value=b"%d" % (sequence + index), headers=[])
    return bytes(builder.build())


def _produce(client: RawClient, records: bytes) -> tuple[ErrorCode, int]:
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    request = ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                             topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[data])])
    [topic] = client.request(request, ProduceResponse, 7).responses
    [partition] = topic.partition_responses
    return ErrorCode(partition.error_code), partition.base_offset


def _values(data: Path) -> list[int]:
    with Store.open(data) as store:
        return [int(value) for value in store.read("t", 0)["value"].to_pylist()]


def test_a_retried_batch_is_answered_with_its_offset_across_restarts_and_stored_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
    with _client(data) as client:
        assert _produce(client, _batch(0, 3)) == (ErrorCode.NONE, 0)
        assert _produce(client, _batch(3, 2)) == (ErrorCode.NONE, 3)
        assert _produce(client, _batch(0, 3)) == (ErrorCode.NONE, 0)  # a retry: the first answer again
        assert _produce(client, _batch(9, 1)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        assert _produce(client, _batch(0, 1, epoch=1)) == (ErrorCode.NONE, 5)  # a new epoch starts at 0
        assert _produce(client, _batch(1, 1, epoch=0)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
        assert _produce(client, _batch(5, 1, producer_id=PRODUCER + 1)) == (ErrorCode.NONE, 6)  # unknown: any
    with _client(data) as client:  # a clean restart: the snapshot
        assert _produce(client, _batch(0, 1, epoch=1)) == (ErrorCode.NONE, 5)
        assert _produce(client, _batch(1, 1, epoch=1)) == (ErrorCode.NONE, 7)
    (data / "t-0" / SNAPSHOT).unlink()  # only the journal is left... and it was emptied by the snapshot
    with _client(data) as client:
        assert _produce(client, _batch(6, 1, producer_id=PRODUCER + 1)) == (ErrorCode.NONE, 8)
    assert _values(data) == [0, 1, 2, 3, 4, 0, 5, 1, 6]


def test_the_journal_alone_rebuilds_the_state_and_drops_batches_never_written(tmp_path: Path) -> None:
    """As after a kill -9: journal lines without a snapshot past them; the last names offsets the log never got
    (the crash came between the journal line and the segment write), and a torn line follows it."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
        store.append("t", [{"key": None, "value": b"%d" % n} for n in range(4)], partition=0)
    folder = data / "t-0"
    state = ProducerState.load(folder, end_offset=4, now_ms=1)
    state.begin([ProducerBatch(PRODUCER, 0, 0, 3, 0, 3, 1)])
    state.begin([ProducerBatch(PRODUCER, 0, 4, 4, 4, 4, 1)])  # never written to the log
    with open(folder / JOURNAL, "ab") as journal:
        journal.write(b'{"record":"producer-batch","ver')
    (folder / SNAPSHOT).unlink()
    reloaded = ProducerState.load(folder, end_offset=4, now_ms=2)
    assert reloaded.check(PRODUCER, 0, 0, 3) == (Verdict.DUPLICATE, 0)
    assert reloaded.check(PRODUCER, 0, 4, 4) == (Verdict.APPEND, None)
    assert reloaded.check(PRODUCER, 0, 5, 5) == (Verdict.OUT_OF_ORDER, None)
    assert (folder / JOURNAL).read_bytes() == b""  # loading snapshots and starts the journal afresh


def test_a_damaged_journal_line_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    folder = tmp_path
    state = ProducerState.load(folder, end_offset=10, now_ms=1)
    state.begin([ProducerBatch(PRODUCER, 0, 0, 4, 0, 4, 1)])
    state.begin([ProducerBatch(PRODUCER + 1, 0, 0, 4, 5, 9, 1)])
    (folder / SNAPSHOT).unlink()
    journal = bytearray((folder / JOURNAL).read_bytes())
    journal[journal.index(b'"first_offset":0') + 15] = ord("1")  # the CRC no longer matches
    (folder / JOURNAL).write_bytes(bytes(journal))
    reloaded = ProducerState.load(folder, end_offset=10, now_ms=2)
    assert reloaded.check(PRODUCER, 0, 0, 4) == (Verdict.APPEND, None)  # forgotten, never wrong
    assert reloaded.check(PRODUCER + 1, 0, 0, 4) == (Verdict.DUPLICATE, 5)
