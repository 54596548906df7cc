"""The Kafka ingest source's options (streaming/kafka_source.py); its Spark runs are in
tests/spark/test_kafka_mirror.py."""

from __future__ import annotations

import pytest

from streaming.kafka_source import KafkaSourceOptionError, SourceOptions


def test_options_are_checked_with_clear_errors() -> None:
    with pytest.raises(KafkaSourceOptionError, match=r"kafka\.bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "t"})
    with pytest.raises(KafkaSourceOptionError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "{bad"})
    with pytest.raises(KafkaSourceOptionError, match="maxOffsetsPerTrigger"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"})
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b",
                                  "startingOffsets": '{"a": {"0": 5, "1": -2}}'})
    assert parsed.topics == ("a", "b") and parsed.starting_offsets == {"a": {"0": 5, "1": -2}}
