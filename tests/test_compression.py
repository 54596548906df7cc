"""Topic compression (compression.type): compressed raw segments read back through every reader as uncompressed
ones do, their CRC-32C still covers every stored byte (DESIGN.md invariant 1: a flipped byte is an error naming
the file, never skipped data), Kafka's codecs without an Arrow IPC codec are refused with what is allowed
(invariant 10), and batches written before compression or compact null headers existed still read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from compactor import Compactor
from ledgerview.kafka import KafkaEndpoint
from readers import Reader, TableView
from storage import Store
from storage.batch_files import BatchFile
from storage.codec import HEADER_BYTES, BatchHeader, read_header, with_checksum
from storage.config import InvalidConfigError, TopicConfig
from storage.errors import CorruptSegmentError, InvalidMessagesError
from storage.schema import HEADER_TYPE, STORED_SCHEMA
from tests.conftest import TINY, ManualClock
from tests.kafka_support import consumed_from_start

CODECS = ["lz4", "zstd"]
MESSAGES = 300


def messages(count: int = MESSAGES, start: int = 0) -> pa.Table:
    """Keyed messages over 11 keys, compressible values, a few headers and tombstones."""
    keys = [f"key{i % 11:03d}".encode() for i in range(start, start + count)]
    values = [None if i % 37 == 36 else f"price {i % 50}.00 ".encode() * 8 for i in range(start, start + count)]
    headers = [[{"key": "source", "value": b"feed"}] if i % 5 == 0 else None for i in range(start, start + count)]
    return pa.table({"key": keys, "value": values, "headers": pa.array(headers, HEADER_TYPE)})


def filled(folder: Path, codec: str, *, config: dict[str, str] | None = None, clock: ManualClock | None = None) -> (
    Store
):
    store = Store.open(folder, clock=clock) if clock else Store.open(folder)
    store.create_topic("t", config={**TINY, "compression.type": codec, **(config or {})})
    for start in range(0, MESSAGES, 60):
        store.append("t", messages(60, start), partition=0)
    return store


def stored_codecs(folder: Path) -> set[str | None]:
    """The codecs of the batches holding messages (a batch the cleaner emptied, kept for its offsets, has none)."""
    return {scanned.header.compression for path in sorted(folder.glob("t-0/*.log"))
            for scanned in BatchFile(path).scan() if scanned.header.record_count}


def raw_rows(store: Store) -> list[tuple[int, bytes | None, bytes | None, object]]:
    table = store.read("t", 0)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(),
                    table["headers"].to_pylist(), strict=True))


@pytest.fixture
def plain(tmp_path: Path) -> Store:
    with filled(tmp_path / "plain", "uncompressed") as store:
        return store


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_topic_stores_its_codec_and_reads_back_as_the_uncompressed_one(
        tmp_path: Path, codec: str) -> None:
    with filled(tmp_path / "plain", "uncompressed") as plain, filled(tmp_path / codec, codec) as store:
        assert stored_codecs(tmp_path / codec) == {codec}
        assert stored_codecs(tmp_path / "plain") == {None}
        assert raw_rows(store) == raw_rows(plain)
        assert store.partition_log("t", 0).size_bytes < plain.partition_log("t", 0).size_bytes * 0.75
        assert store.offset_for_timestamp("t", 0, 0) == 0


@pytest.mark.parametrize("codec", CODECS)
def test_reader_table_view_and_compacted_view_read_a_compressed_topic(tmp_path: Path, codec: str) -> None:
    def views(folder: Path, codec: str) -> tuple[list[Any], list[Any], list[Any]]:
        with filled(folder, codec) as store:
            Compactor(store).compact("t")
            store.append("t", messages(30, MESSAGES), partition=0)
            raw = [(m.offset, m.key, m.value, m.headers) for m in Reader(store, "t", start="earliest")]
            compacted = [(m.offset, m.key, m.value) for m in Reader(store, "t", read_compacted=True,
                                                                    start="earliest")]
            view = TableView(store, "t")
            table = [(key, view.get(key)) for key in sorted({f"key{i:03d}".encode() for i in range(11)})]
        ledger = next((folder / "t-0" / "compacted").glob("*.ledger"))
        assert {scanned.header.compression for scanned in BatchFile(ledger).scan()} == {codec_or_none(codec)}
        return raw, compacted, table

    expected = views(tmp_path / "plain", "uncompressed")
    assert views(tmp_path / codec, codec) == expected
    assert stored_codecs(tmp_path / codec) == {codec}
    assert any(headers for *_, headers in expected[0])


def codec_or_none(codec: str) -> str | None:
    return None if codec == "uncompressed" else codec


@pytest.mark.parametrize("codec", CODECS)
def test_the_cleaner_keeps_a_compressed_topic_compressed(tmp_path: Path, codec: str) -> None:
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"}
    with filled(tmp_path / codec, codec, config=config) as store:
        latest = {key: (offset, value) for offset, key, value, _ in raw_rows(store)}
        store.roll("t", 0)
        [stats] = store.clean("t")
        assert stats.messages_written < stats.messages_read
        cleaned = {key: (offset, value) for offset, key, value, _ in raw_rows(store)}
        assert cleaned == latest
        assert stored_codecs(tmp_path / codec) == {codec}


@pytest.mark.parametrize("codec", CODECS)
def test_the_remote_tier_serves_compressed_segments(tmp_path: Path, codec: str) -> None:
    clock = ManualClock()
    tier = f"file://{tmp_path / 'tier'}"
    config = {"remote.storage.enable": "true", "local.retention.ms": "0", "file.delete.delay.ms": "0"}
    with filled(tmp_path / "plain", "uncompressed") as plain:
        expected = raw_rows(plain)
    with Store.open(tmp_path / codec, remote=tier, clock=clock) as store:
        store.create_topic("t", config={**TINY, "compression.type": codec, **config})
        for start in range(0, MESSAGES, 60):
            store.append("t", messages(60, start), partition=0)
        store.roll("t", 0)
        store.sync_remote()
        clock.advance(1)
        store.enforce_retention("t")
        assert not [path for path in (tmp_path / codec / "t-0").glob("*.log") if path.stat().st_size]
        assert raw_rows(store) == expected
    assert [(m.offset, m.key, m.value) for m in Reader(tier, "t", start="earliest")] == [
        (offset, key, value) for offset, key, value, _ in expected]


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_the_kafka_endpoint_serves_a_compressed_topic(tmp_path: Path, codec: str) -> None:
    data = tmp_path / "data"
    with filled(data, codec) as store:
        expected = [(offset, key, value) for offset, key, value, _ in raw_rows(store)]
    with KafkaEndpoint(data, port=0) as endpoint:
        got = consumed_from_start(f"127.0.0.1:{endpoint.port}", "t", len(expected))
    assert got == expected


@pytest.mark.parametrize("codec", CODECS)
def test_a_flipped_byte_in_a_compressed_sealed_segment_is_an_error_naming_the_file(
        tmp_path: Path, codec: str) -> None:
    with filled(tmp_path / codec, codec) as store:
        store.roll("t", 0)
    first = min((tmp_path / codec / "t-0").glob("*.log"))
    data = bytearray(first.read_bytes())
    header = read_header(bytes(data), 0, len(data))
    data[HEADER_BYTES + (header.batch_length - HEADER_BYTES) // 2] ^= 0x01  # inside the compressed body
    first.write_bytes(bytes(data))
    with Store.open(tmp_path / codec) as store, pytest.raises(CorruptSegmentError) as caught:
        store.read("t", 0)
    assert str(first) in str(caught.value)
    assert "CRC-32C mismatch" in str(caught.value)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "GZIP"])
def test_kafka_codecs_without_an_arrow_codec_are_refused_saying_why_and_what_is_allowed(codec: str) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        TopicConfig.from_overrides({"compression.type": codec})
    message = str(caught.value)
    assert "expected one of: producer, uncompressed, lz4, zstd." in message
    assert f"Kafka's {codec.lower()} has no Arrow IPC buffer codec" in message


def test_an_unknown_compression_type_is_refused_listing_the_allowed_values() -> None:
    with pytest.raises(InvalidConfigError) as caught:
        TopicConfig.from_overrides({"compression.type": "brotli"})
    assert str(caught.value).endswith("expected one of: producer, uncompressed, lz4, zstd.")


def test_producer_keeps_each_appends_codec_and_a_set_type_overrides_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("t", config={"segment.bytes": "1048576"})
        for codec in (None, "lz4", "zstd"):
            store.append("t", messages(20), partition=0, compression=codec)
        with pytest.raises(InvalidMessagesError, match="allowed: lz4, zstd, none"):
            store.append("t", messages(1), partition=0, compression="gzip")
        store.alter_topic_config("t", {"compression.type": "zstd"})
        store.append("t", messages(20), partition=0, compression="lz4")
    batches = [scanned.header.compression for scanned in BatchFile(tmp_path / "data" / "t-0" /
                                                                    "00000000000000000000.log").scan()]
    assert batches == [None, "lz4", "zstd", "zstd"]


def test_a_batch_without_headers_stores_no_per_message_bytes_for_them(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data") as store:
        store.create_topic("t")
        store.append("t", pa.table({"key": [b"k"] * 10_000, "value": [b"v"] * 10_000}), partition=0)
    size = (tmp_path / "data" / "t-0" / "00000000000000000000.log").stat().st_size
    # offset and timestamp 16 bytes, key and value 1 byte + 4 bytes of offsets each, headers 4 bytes of offsets
    # and a validity bit: about 31 bytes a message; pa.nulls' children would add 12 more.
    assert size < 10_000 * 32


def test_a_batch_written_with_full_null_header_children_still_reads(tmp_path: Path) -> None:
    """Batches written before null headers were stored compactly carry rows + 1 offsets in each header child."""
    rows = 50
    old = pa.RecordBatch.from_arrays(
        [pa.array(range(rows), pa.int64()), pa.array([1_700_000_000_000] * rows, pa.int64()),
         pa.array([b"k"] * rows), pa.array([b"v"] * rows), pa.nulls(rows, HEADER_TYPE)], schema=STORED_SCHEMA)
    payload = old.serialize().to_pybytes()  # one encapsulated IPC record-batch message, as the payload is
    assert len(payload) > 3 * 4 * rows  # the children's offsets are there
    header = BatchHeader(base_offset=0, batch_length=HEADER_BYTES + len(payload), crc=0, attributes=0,
                         last_offset_delta=rows - 1, record_count=rows, first_timestamp=1_700_000_000_000,
                         max_timestamp=1_700_000_000_000, position=0)
    encoded = with_checksum(header, (payload,))
    with Store.open(tmp_path / "data") as store:
        store.create_topic("t")
    (tmp_path / "data" / "t-0" / "00000000000000000000.log").write_bytes(
        b"".join(bytes(piece) for piece in encoded.pieces))
    with Store.open(tmp_path / "data") as store:
        assert store.read("t", 0).select(STORED_SCHEMA.names).to_batches()[0].equals(old)
        store.append("t", [(b"k", b"new")], partition=0)
        assert store.read("t", 0)["value"].to_pylist() == [b"v"] * rows + [b"new"]
