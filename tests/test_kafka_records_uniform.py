"""The decoder's uniform-run path (records of one size read as columns of a 2-D array) against its general path
(record by record bounds, varints read per field): on batches of same-sized runs, on irregular ones (many sizes,
nulls, headers, long timestamp gaps, runs cut where a delta's varint grows) and on damaged ones (bytes overwritten
inside the records, CRC made right again), both give the same messages or the same error."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerview.kafka import records
from ledgerview.kafka.records import CRC_START, RecordBatchError, decode_batches

BASE_TIMESTAMP = 1_700_000_000_000
Run = tuple[int, int | None, int | None]
"""(messages, key length or None for null keys, value length or None for tombstones)."""

runs = st.lists(st.tuples(st.integers(1, 200), st.one_of(st.none(), st.integers(0, 20)),
                          st.one_of(st.none(), st.integers(0, 150))), min_size=1, max_size=4)
timestamp_steps = st.sampled_from([0, 1, 3, 70, 9000])


def _built(batch_runs: list[Run], step: int, headers_at: int | None = None) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=10**8)
    offset = 0
    for count, key_length, value_length in batch_runs:
        for _ in range(count):
            key = None if key_length is None else bytes([offset % 251]) * key_length
            value = None if value_length is None else bytes([(offset * 7) % 253]) * value_length
            pairs = [("h", b"v")] if offset == headers_at else []
            builder.append(offset, timestamp=BASE_TIMESTAMP + offset * step, key=key, value=value, headers=pairs)
            offset += 1
    return bytes(builder.build())


def _decoded_both_ways(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """(uniform-run path's result, general path's result); a result is the messages or the error's type."""
    results = []
    for uniform in (True, False):
        with monkeypatch.context() as patch:
            if not uniform:
                patch.setattr(records, "_uniform_runs", lambda body, data, count: None)
            try:
                [batch] = decode_batches(data)
                results.append(batch.records.to_pylist())
            except RecordBatchError as error:
                results.append(type(error))
    return results[0], results[1]


@given(runs, timestamp_steps)
@settings(max_examples=60)
def test_uniform_and_general_paths_decode_the_same_messages(batch_runs: list[Run], step: int) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        data = _built(batch_runs, step)
        uniform, general = _decoded_both_ways(data, monkeypatch)
    assert uniform == general
    assert isinstance(uniform, list)
    expected_keys = [None if key is None else bytes([offset % 251]) * key
                     for offset, key in enumerate(key for count, key, _ in batch_runs for _ in range(count))]
    assert [row["key"] for row in uniform] == expected_keys
    assert [row["timestamp"] for row in uniform] == [BASE_TIMESTAMP + offset * step
                                                      for offset in range(len(expected_keys))]


def test_same_sized_records_take_the_uniform_path_across_varint_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []
    decode_runs = records._decode_runs

    def counted(data: object, runs: list[object], count: int, base_timestamp: int) -> object:
        taken.append(len(runs))
        return decode_runs(data, runs, count, base_timestamp)  # type: ignore[arg-type]

    monkeypatch.setattr(records, "_decode_runs", counted)
    # offset and timestamp deltas grow a byte at 64 and 8192: three runs
    [batch] = decode_batches(_built([(9000, 9, 100)], step=1), batch_bytes_max=2 << 20)
    assert taken == [3]
    assert batch.records.num_rows == 9000
    assert batch.records["value"][8999].as_py() == bytes([(8999 * 7) % 253]) * 100


def test_irregular_records_take_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[object] = []
    monkeypatch.setattr(records, "_decode_runs", lambda *args: taken.append(args))
    many_sizes = _built([(40, 3, length) for length in range(12)], step=1)
    with_headers = _built([(100, 3, 10)], step=1, headers_at=50)
    assert [batch.records.num_rows for data in (many_sizes, with_headers) for batch in decode_batches(data)] == [
        480, 100]
    assert taken == []


@given(runs, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3))
@settings(max_examples=150)
def test_damaged_records_give_the_same_answer_on_both_paths(batch_runs: list[Run],
                                                              damage: list[tuple[int, int]]) -> None:
    data = bytearray(_built(batch_runs, step=1))
    records_start = records.BATCH_HEADER_BYTES
    for position, byte in damage:
        data[records_start + position % (len(data) - records_start)] = byte
    struct.pack_into(">I", data, 17, crc32c.crc32c(data[CRC_START:]))  # the damage passes the CRC check
    with pytest.MonkeyPatch.context() as monkeypatch:
        uniform, general = _decoded_both_ways(bytes(data), monkeypatch)
    assert uniform == general

