"""The ledgerview stream source's trigger limits (streaming/source.py), driven as Spark's planner drives it:
minOffsetsPerTrigger holds a micro-batch back until enough offsets wait or maxTriggerDelay has passed, as
Spark's Kafka source does, and availableNow never waits."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql.streaming.datasource import ReadAllAvailable

from storage import Store
from streaming.source import SourceOptions, TopicStream


def test_min_offsets_wait_for_more_or_for_the_delay(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t", partitions=2)
        store.append("t", [(f"k{i}", "v") for i in range(30)])
    source = TopicStream(SourceOptions.parse({"path": str(tmp_path), "topic": "t", "startingOffsets": "earliest",
                                              "minOffsetsPerTrigger": "50", "maxTriggerDelay": "10s"}))
    now = [0.0]
    source.clock_ms = lambda: now[0]
    start = source.initialOffset()
    assert source.latestOffset(start, ReadAllAvailable()) == start  # 30 wait, 50 wanted, no delay passed
    with Store.open(tmp_path) as store:
        store.append("t", [(f"k{i}", "v") for i in range(30)])
    moved = source.latestOffset(start, ReadAllAvailable())
    assert sum(moved.values()) - sum(start.values()) == 60
    with Store.open(tmp_path) as store:
        store.append("t", [("k1", "v")])
    now[0] = 9_999.0
    assert source.latestOffset(moved, ReadAllAvailable()) == moved
    now[0] = 10_000.0  # the delay passed since the last batch: one message is enough
    assert sum(source.latestOffset(moved, ReadAllAvailable()).values()) == sum(moved.values()) + 1


def test_available_now_takes_what_there_is(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t")
        store.append("t", [("k", "v")] * 3)
    source = TopicStream(SourceOptions.parse({"path": str(tmp_path), "topic": "t", "startingOffsets": "earliest",
                                              "minOffsetsPerTrigger": "50"}))
    source.prepareForTriggerAvailableNow()
    assert source.latestOffset(source.initialOffset(), ReadAllAvailable())["0"] == 3
