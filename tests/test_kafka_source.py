"""The Kafka ingest source (streaming/kafka_source.py): its options, a task's read of a range whose start the
cluster deleted (data loss per failOnDataLoss), and the planner's connection closed when the query stops; its
Spark runs are in tests/spark/test_kafka_mirror.py and tests/spark/test_kafka_source_offsets.py."""

from __future__ import annotations

import pytest

from streaming.kafka_source import KafkaRange, KafkaStreamReader, SourceOptions, read_range
from streaming.options import InvalidOptionError, UnknownOptionError
from streaming.source_offsets import DataLossError
from tests.kafka_support import Running, established_connections_to, kafka, wait_for

__all__ = ["kafka"]


def test_options_are_checked_with_clear_errors() -> None:
    with pytest.raises(InvalidOptionError, match=r"kafka\.bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "t"})
    with pytest.raises(InvalidOptionError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "{bad"})
    with pytest.raises(InvalidOptionError, match="maxOffsetsPerTrigger"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"})
    with pytest.raises(InvalidOptionError, match=r"failOnDataLoss='yes'.*allowed: true or false"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "failOnDataLoss": "yes"})
    with pytest.raises(UnknownOptionError, match=r"Unknown option maxoffsetpertrigger .*Valid options: .*"
                                                 r"maxOffsetsPerTrigger"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "maxoffsetpertrigger": "5"})
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b",
                                  "startingOffsets": '{"a": {"0": 5, "1": -2}}'})
    assert parsed.topics == ("a", "b") and parsed.starting_offsets == {"a": {"0": 5, "1": -2}}
    assert parsed.fail_on_data_loss
    assert not SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t",
                                    "failOnDataLoss": "False"}).fail_on_data_loss


@pytest.mark.slow
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_task_whose_range_start_was_deleted_reports_data_loss_or_reads_from_the_first_offset(
        kafka: Running, fail_on_data_loss: bool) -> None:
    """Retention may delete a planned range's start before its task reads it (after the driver's check)."""
    kafka.store.create_topic("source", config={"segment.bytes": "2048"})
    kafka.store.append("source", [(b"k", b"v%d" % i) for i in range(200)])
    kafka.store.delete_records("source", 0, 150)
    planned = KafkaRange(kafka.bootstrap, "source", 0, 100, 200, fail_on_data_loss)
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"Data loss in source-0: .* from 100, .* below 150"):
            list(read_range(planned))
    else:
        offsets = [offset for batch in read_range(planned) for offset in batch.column("offset").to_pylist()]
        assert offsets == list(range(150, 200))


@pytest.mark.slow
def test_stopping_the_source_closes_its_connections_to_the_cluster(kafka: Running) -> None:
    kafka.store.create_topic("source", partitions=2)
    reader = KafkaStreamReader(SourceOptions.parse({"bootstrap.servers": kafka.bootstrap, "subscribe": "source"}))
    assert reader.initialOffset() == {"source": {"0": 0, "1": 0}}
    assert established_connections_to(kafka.endpoint.port) > 0
    reader.stop()
    wait_for(lambda: established_connections_to(kafka.endpoint.port) == 0, "the source's connections to close",
             timeout_seconds=30)
