"""A partition's stored batches read joined (``PartitionLog.read_batches(join_bytes=...)``, as the compactor reads
the raw log): the same messages at the same offsets as reading one stored batch at a time, whatever layout each
batch has (offsets implied, or stored after cleaning left gaps; headers or none; compressed or not), in fewer
batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from readers.partition_read import open_partition_read
from readers.positions import Earliest
from storage import Store
from storage.errors import CorruptSegmentError
from storage.schema import STORED_SCHEMA

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0", "compression.type": "producer",
           "segment.bytes": "8192"}
HEADER_TYPE = STORED_SCHEMA.field("headers").type


def messages(start: int, count: int, *, with_headers: bool) -> pa.Table:
    keys = [f"k{i % 7}".encode() for i in range(start, start + count)]
    values = [None if i % 11 == 10 else f"v{i}".encode() for i in range(start, start + count)]
    headers = [[{"key": "h", "value": f"{i}".encode()}] if with_headers else None for i in range(start, start + count)]
    return pa.table({"key": keys, "value": values, "headers": pa.array(headers, HEADER_TYPE)})


@pytest.fixture
def mixed(store: Store) -> Store:
    """Batches of 10 messages of every layout: a cleaned part (offsets stored, gaps between them), then appended
    ones compressed and not, a stretch of them with headers, over several segments."""
    store.create_topic("t", config=COMPACT)
    for number, start in enumerate(range(0, 600, 10)):
        if start == 300:
            store.roll("t", 0)
            store.clean("t")  # the segments below 300 now keep each key's latest message only
        store.append("t", messages(start, 10, with_headers=40 <= number < 45), partition=0,
                     compression="zstd" if number % 4 == 2 else None)
    return store


@pytest.mark.parametrize(("start", "end"), [(0, 600), (13, 587), (295, 305), (451, 452)])
def test_joined_batches_hold_the_messages_stored_batches_hold(mixed: Store, start: int, end: int) -> None:
    log = mixed.partition_log("t", 0)
    stored = list(log.read_batches(start, end))
    expected = pa.Table.from_batches(stored, STORED_SCHEMA)
    assert expected.num_rows and expected["offset"][0].as_py() >= start and expected["offset"][-1].as_py() < end
    for join_bytes in (1, 300, 4096, 1 << 20):
        joined = list(log.read_batches(start, end, join_bytes=join_bytes))
        assert pa.Table.from_batches(joined, STORED_SCHEMA).equals(expected), join_bytes
        assert all(batch.schema.equals(STORED_SCHEMA) for batch in joined)
        if join_bytes >= 4096 and end - start > 100:
            assert len(joined) <= len(stored) // 2, (join_bytes, len(joined), len(stored))


def test_the_cleaned_part_really_has_stored_offsets_with_gaps(mixed: Store) -> None:
    """The fixture's premise: below 300 the cleaner left each key's latest message, so offsets skip."""
    offsets = mixed.read("t", 0, end_offset=300)["offset"].to_pylist()
    assert 7 <= len(offsets) < 300 and offsets == sorted(offsets)


def test_a_consumer_read_serves_the_raw_log_as_stored(mixed: Store) -> None:
    """Not joined: the Kafka endpoint's fetch keeps slices of a read's batches until its response is written, and a
    one-message slice of a joined batch would keep the whole copy (up to 1 MiB) alive, where a stored batch's slice
    points into the segment's memory map."""
    read = open_partition_read(mixed, "t", 0, Earliest(), read_compacted=False)
    try:
        served = list(read.batches())
    finally:
        read.close()
    stored = list(mixed.read_batches("t", 0))
    assert [batch.num_rows for batch in served] == [batch.num_rows for batch in stored]
    assert pa.Table.from_batches(served).equals(pa.Table.from_batches(stored))


def test_a_stored_batch_as_large_as_the_join_is_served_alone(store: Store) -> None:
    """Joining would only copy it: the small batches before it are served joined, it is served as stored."""
    store.create_topic("t")
    for start, count in ((0, 10), (10, 10), (20, 10), (30, 500), (530, 10)):
        store.append("t", messages(start, count, with_headers=False), partition=0)
    joined = list(store.partition_log("t", 0).read_batches(0, 540, join_bytes=4096))
    assert [batch.num_rows for batch in joined] == [30, 500, 10]


def test_a_joined_read_serves_every_message_before_a_damaged_batch_then_fails(store: Store) -> None:
    """As an unjoined read does (the Kafka endpoint's fetch serves up to the damage, then CORRUPT_MESSAGE): the
    batches held for joining when the damage is met are served before the error, not lost with it."""
    store.create_topic("t")
    for start in range(0, 50, 10):
        store.append("t", messages(start, 10, with_headers=False), partition=0)
    store.roll("t", 0)
    [segment, _] = store.segments("t", 0)
    damaged_header = list(segment.scan(0))[2]
    path = Path(segment.source)
    damaged = bytearray(path.read_bytes())
    damaged[damaged_header.position + damaged_header.batch_length - 16] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with Store.open(store.root) as reading:
        served: list[int] = []
        with pytest.raises(CorruptSegmentError, match="CRC-32C mismatch"):
            for batch in reading.read_batches("t", 0, join_bytes=1 << 20):
                served += batch.column("offset").to_pylist()
    assert served == list(range(20))
