"""Dictionary-encoded compressed batches: a compressed batch whose keys or values repeat stores them as a dictionary
and reads back, through every reader (raw segments, the compacted ledger, the cleaner, the remote tier, the Kafka
endpoint), exactly as the same messages in an uncompressed topic (DESIGN.md invariant 2: what was appended is what
is read); batches that do not benefit, and uncompressed topics, keep the plain layout; batches written before
dictionaries existed still read; and a damaged dictionary payload is a corruption error naming the file
(invariant 1), never a crash or wrong data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compactor import Compactor
from ledgerview.kafka import KafkaEndpoint
from readers import Reader, TableView
from storage import Store
from storage.batch_files import BatchFile
from storage.codec import HEADER_BYTES, BatchHeader, payload_of, with_checksum
from storage.errors import CorruptSegmentError
from storage.schema import HEADER_TYPE, STORED_SCHEMA, null_headers
from tests.cli_runner import run_cli
from tests.conftest import ManualClock
from tests.kafka_support import consumed_from_start

CODECS = ["lz4", "zstd"]
ROWS = 3000
CONFIG = {"segment.bytes": "1048576"}
FIRST_TIMESTAMP_MS = 1_700_000_000_000


def ticks(start: int = 0, rows: int = ROWS) -> pa.Table:
    """Few distinct keys and values: 1,200 keys (every 97th message keyless), 40 prices (every 31st message a
    tombstone), a header on every 7th message, timestamps 10 ms apart."""
    index = range(start, start + rows)
    return pa.table({
        "key": [None if i % 97 == 0 else f"SYM{i % 1200:04d}".encode() for i in index],
        "value": [None if i % 31 == 0 else f"{100 + i % 40}.25".encode() for i in index],
        "timestamp": pa.array([FIRST_TIMESTAMP_MS + 10 * i for i in index], pa.int64()),
        "headers": pa.array([[{"key": "source", "value": b"feed"}] if i % 7 == 0 else None for i in index],
                            HEADER_TYPE),
    })


def filled(folder: Path, codec: str, *, config: dict[str, str] | None = None, appends: int = 2,
           clock: ManualClock | None = None, remote: str | None = None) -> Store:
    store = Store.open(folder, clock=clock, remote=remote) if clock else Store.open(folder)
    store.create_topic("t", config={**CONFIG, "compression.type": codec, **(config or {})})
    for append in range(appends):
        store.append("t", ticks(append * ROWS), partition=0)
    return store


def payload_layouts(path: Path) -> list[str]:
    """Per batch holding messages, the Arrow IPC message its payload starts with: ``schema`` for a dictionary
    payload (a stream), ``record batch`` for the plain layout."""
    file = BatchFile(path)
    return [pa.ipc.read_message(payload_of(file.buffer, scanned.header)).type
            for scanned in file.scan() if scanned.header.record_count]


def log_layouts(folder: Path) -> set[str]:
    return {layout for path in sorted((folder / "t-0").glob("*.log")) for layout in payload_layouts(path)}


def raw_rows(store: Store) -> list[tuple[Any, ...]]:
    table = store.read("t", 0).select(STORED_SCHEMA.names)
    return list(zip(*(table[name].to_pylist() for name in STORED_SCHEMA.names), strict=True))


@pytest.mark.parametrize("codec", CODECS)
def test_few_distinct_keys_and_values_are_stored_as_dictionaries_and_read_back_exactly(
        tmp_path: Path, codec: str) -> None:
    with filled(tmp_path / "plain", "uncompressed") as plain, filled(tmp_path / codec, codec) as store:
        assert log_layouts(tmp_path / codec) == {"schema"}
        assert raw_rows(store) == raw_rows(plain)
        rows = raw_rows(store)
        assert {key is None for _, _, key, _, _ in rows} == {True, False}
        assert {value is None for _, _, _, value, _ in rows} == {True, False}
        assert any(headers for *_, headers in rows)
        assert store.offset_for_timestamp("t", 0, FIRST_TIMESTAMP_MS + 10 * ROWS) == ROWS


@pytest.mark.parametrize("codec", CODECS)
def test_the_compacted_ledger_and_the_views_read_dictionary_batches(tmp_path: Path, codec: str) -> None:
    def views(folder: Path, codec: str) -> tuple[list[Any], list[Any], list[Any]]:
        with filled(folder, codec) as store:
            Compactor(store).compact("t")
            store.append("t", ticks(2 * ROWS), partition=0)
            raw = [(m.offset, m.timestamp, m.key, m.value, m.headers) for m in Reader(store, "t", start="earliest")]
            compacted = [(m.offset, m.key, m.value) for m in Reader(store, "t", read_compacted=True,
                                                                    start="earliest")]
            view = TableView(store, "t")
            table = [(key, view.get(key)) for key in (f"SYM{i:04d}".encode() for i in range(0, 1200, 37))]
        return raw, compacted, table

    expected = views(tmp_path / "plain", "uncompressed")
    assert views(tmp_path / codec, codec) == expected
    [ledger] = (tmp_path / codec / "t-0" / "compacted").glob("*.ledger")
    assert "schema" in payload_layouts(ledger)  # 1,200 distinct keys stay plain, their 40 prices do not
    assert len(expected[1]) > 1024


def test_the_cleaner_reads_and_writes_dictionary_batches(tmp_path: Path) -> None:
    def cleaned(folder: Path, codec: str) -> list[tuple[Any, ...]]:
        with filled(folder, codec, config={"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0"},
                    appends=3) as store:
            store.roll("t", 0)
            [stats] = store.clean("t")
            assert 0 < stats.messages_written < stats.messages_read
            return raw_rows(store)

    expected = cleaned(tmp_path / "plain", "uncompressed")
    assert cleaned(tmp_path / "zstd", "zstd") == expected
    assert log_layouts(tmp_path / "zstd") == {"schema"}


def test_the_remote_tier_serves_dictionary_batches(tmp_path: Path) -> None:
    clock = ManualClock()
    tier = f"file://{tmp_path / 'tier'}"
    config = {"remote.storage.enable": "true", "local.retention.ms": "0", "file.delete.delay.ms": "0"}
    with filled(tmp_path / "plain", "uncompressed") as plain:
        expected = raw_rows(plain)
    with filled(tmp_path / "zstd", "zstd", config=config, clock=clock, remote=tier) as store:
        assert log_layouts(tmp_path / "zstd") == {"schema"}
        store.roll("t", 0)
        store.sync_remote()
        clock.advance(10 * 2 * ROWS)  # past the last message's timestamp
        store.enforce_retention("t")
        assert not [path for path in (tmp_path / "zstd" / "t-0").glob("*.log") if path.stat().st_size]
        assert raw_rows(store) == expected
    assert [(m.offset, m.key, m.value) for m in Reader(tier, "t", start="earliest")] == [
        (offset, key, value) for offset, _, key, value, _ in expected]


@pytest.mark.slow
def test_the_kafka_endpoint_serves_dictionary_batches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with filled(data, "zstd") as store:
        expected = [(offset, key, value) for offset, _, key, value, _ in raw_rows(store)]
    assert log_layouts(data) == {"schema"}
    with KafkaEndpoint(data, port=0) as endpoint:
        got = consumed_from_start(f"127.0.0.1:{endpoint.port}", "t", len(expected))
    assert got == expected


def unique_rows(rows: int) -> pa.Table:
    """Keys and values that never repeat, as random keys and payloads do."""
    random = np.random.default_rng(3)
    return pa.table({"key": [random.bytes(10) for _ in range(rows)], "value": [random.bytes(20) for _ in range(rows)]})


@pytest.mark.parametrize(("codec", "messages"), [
    ("zstd", unique_rows(ROWS)),  # nothing repeats: a dictionary would hold every value once more
    ("zstd", ticks(rows=1000)),   # too few messages for a dictionary to pay for its schema message
    ("uncompressed", ticks()),    # read without copying, which a dictionary would undo
], ids=["unique", "small", "uncompressed"])
def test_batches_that_would_not_benefit_stay_plain(tmp_path: Path, codec: str, messages: pa.Table) -> None:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("t", config={**CONFIG, "compression.type": codec})
        store.append("t", messages, partition=0)
        assert log_layouts(tmp_path / "data") == {"record batch"}
        table = store.read("t", 0)
        assert table["key"].to_pylist() == messages["key"].to_pylist()
        assert table["value"].to_pylist() == messages["value"].to_pylist()


def stored_batch(rows: int, *, key: pa.Array | None = None) -> pa.RecordBatch:
    """A batch of STORED_SCHEMA with ``rows`` messages over 3 keys and 2 values (``key``: another key column)."""
    return pa.RecordBatch.from_arrays(
        [pa.array(range(rows), pa.int64()), pa.array([FIRST_TIMESTAMP_MS] * rows, pa.int64()),
         key if key is not None else pa.array([f"k{i % 3}".encode() for i in range(rows)]),
         pa.array([f"v{i % 2}".encode() for i in range(rows)]), null_headers(rows)],
        names=STORED_SCHEMA.names)


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    """``batch`` written by Arrow's IPC stream writer with zstd buffers, without the end-of-stream marker."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes()[:-8])


def record_batch_message(batch: pa.RecordBatch) -> bytes:
    """The record-batch message alone (no schema message before it): the layout of every batch before
    dictionaries existed."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(ipc_stream(batch)))
    reader.read_next_message()  # the schema message
    return bytes(reader.read_next_message().serialize().to_pybytes())


def store_with_one_batch(folder: Path, payload: bytes, rows: int) -> Path:
    """A store whose topic t holds one batch (zstd, CRC-32C valid) with ``payload``; returns its segment file."""
    header = BatchHeader(base_offset=0, batch_length=HEADER_BYTES + len(payload), crc=0, attributes=2,
                         last_offset_delta=rows - 1, record_count=rows, first_timestamp=FIRST_TIMESTAMP_MS,
                         max_timestamp=FIRST_TIMESTAMP_MS, position=0)
    with Store.open(folder) as store:
        store.create_topic("t")
    segment = folder / "t-0" / "00000000000000000000.log"
    segment.write_bytes(b"".join(bytes(piece) for piece in with_checksum(header, (payload,)).pieces))
    return segment


def test_a_compressed_batch_written_before_dictionaries_still_reads(tmp_path: Path) -> None:
    old = stored_batch(2000).cast(STORED_SCHEMA)  # repeats enough that this release would use a dictionary
    store_with_one_batch(tmp_path / "data", record_batch_message(old), 2000)
    with Store.open(tmp_path / "data") as store:
        assert store.read("t", 0).select(STORED_SCHEMA.names).to_batches()[0].equals(old)
        store.append("t", [(b"k", b"new")], partition=0, compression="zstd")
        assert store.read("t", 0)["value"].to_pylist() == [f"v{i % 2}".encode() for i in range(2000)] + [b"new"]


def dictionary_column(indices: list[int], dictionary: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int8()), dictionary, safe=False)


ROWS_DAMAGED = 4
DAMAGED_KEYS = {
    "index outside the dictionary": dictionary_column([0, 1, 2, 7], pa.array([b"a", b"b", b"c"])),
    "dictionary offsets out of order": dictionary_column([0, 1, 0, 1], pa.Array.from_buffers(
        pa.binary(), 2, [None, pa.py_buffer(np.array([0, 2, 1], np.int32).tobytes()), pa.py_buffer(b"ab")])),
    "key column of another type": pa.array(range(ROWS_DAMAGED), pa.int64()),
}


def test_a_dictionary_payload_written_by_arrow_reads_back(tmp_path: Path) -> None:
    """The same construction as the damaged payloads below, undamaged: only the damage makes them fail."""
    keys = dictionary_column([0, 1, 2, 1], pa.array([b"a", b"b", b"c"]))
    store_with_one_batch(tmp_path / "data", ipc_stream(stored_batch(ROWS_DAMAGED, key=keys)), ROWS_DAMAGED)
    with Store.open(tmp_path / "data") as store:
        assert store.read("t", 0)["key"].to_pylist() == [b"a", b"b", b"c", b"b"]


@pytest.mark.parametrize("damage", DAMAGED_KEYS)
def test_a_damaged_dictionary_payload_is_a_corruption_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    payload = ipc_stream(stored_batch(ROWS_DAMAGED, key=DAMAGED_KEYS[damage]))
    segment = store_with_one_batch(tmp_path / "data", payload, ROWS_DAMAGED)
    with Store.open(tmp_path / "data") as store, pytest.raises(CorruptSegmentError) as caught:
        store.read("t", 0)
    assert str(segment) in str(caught.value)
    assert "payload is not a valid Arrow record batch" in str(caught.value)


@pytest.mark.parametrize("kept", ["the schema message", "the schema and dictionary messages"])
def test_a_dictionary_payload_cut_before_its_record_batch_is_a_corruption_error(tmp_path: Path, kept: str) -> None:
    """Arrow's stream reader ends without a batch (StopIteration) there: it must not escape the decoder."""
    keys = dictionary_column([0, 1, 2, 1], pa.array([b"a", b"b", b"c"]))
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(ipc_stream(stored_batch(ROWS_DAMAGED, key=keys))))
    messages = [reader.read_next_message() for _ in range(3)]
    assert [message.type for message in messages] == ["schema", "dictionary", "record batch"]
    kept_messages = messages[:1] if kept == "the schema message" else messages[:2]
    payload = b"".join(bytes(message.serialize().to_pybytes()) for message in kept_messages)
    segment = store_with_one_batch(tmp_path / "data", payload, ROWS_DAMAGED)
    with Store.open(tmp_path / "data") as store, pytest.raises(CorruptSegmentError) as caught:
        store.read("t", 0)
    assert str(segment) in str(caught.value)
    assert "ends before its record batch" in str(caught.value)


@pytest.mark.slow
def test_dump_log_names_the_columns_a_batch_stores_as_dictionaries(tmp_path: Path) -> None:
    with filled(tmp_path / "zstd", "zstd"), filled(tmp_path / "plain", "uncompressed"):
        pass
    dictionaries = run_cli(tmp_path / "zstd", "dump-log", str(tmp_path / "zstd" / "t-0")).out
    assert dictionaries.count("compression: zstd dictionaries: key,value crc:") == 2  # the two appends' batches
    plain = run_cli(tmp_path / "plain", "dump-log", str(tmp_path / "plain" / "t-0")).out
    assert "compression: none crc:" in plain and "dictionaries" not in plain
