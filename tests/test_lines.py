"""Lines in and out, columnar: what produce parses (ledgerview/input_lines.py) and what consume prints
(ledgerview/output_lines.py), held against plain per-message Python. Invariant 10 (malformed lines are named)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerview.input_lines import LineError, LineFormat, parse_chunk
from ledgerview.output_lines import TextFormat, json_lines, json_lines_per_message, text_lines
from storage.schema import MESSAGE_SCHEMA

text_or_null = st.none() | st.text(max_size=12).map(str.encode)
headers = st.none() | st.lists(st.tuples(st.text(max_size=5), text_or_null), max_size=3)
messages = st.lists(st.tuples(text_or_null, text_or_null, headers), min_size=1, max_size=20)


def batch_of(rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"partition": 1, "offset": 10 + i, "timestamp": 1_000 + i, "key": key, "value": value,
         "headers": None if pairs is None else [{"key": k, "value": v} for k, v in pairs]}
        for i, (key, value, pairs) in enumerate(rows)], schema=MESSAGE_SCHEMA)


@given(messages)
def test_json_lines_built_with_arrow_kernels_equal_json_dumps(rows: list) -> None:  # type: ignore[type-arg]
    batch = batch_of(rows)
    columnar = bytes(json_lines(batch))
    assert columnar == json_lines_per_message(batch)
    decoded = [json.loads(line) for line in columnar.decode().split("\n")[:-1]]
    assert [(m["key"], m["value"]) for m in decoded] == [
        (None if k is None else k.decode(), None if v is None else v.decode()) for k, v, _ in rows]


def test_json_lines_replace_bytes_that_are_not_utf8() -> None:
    line = json.loads(bytes(json_lines(batch_of([(b"k", b"\xff\xfe", None)]))))
    assert line["value"] == "\ufffd\ufffd"


simple_text = st.text(alphabet=st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)),
                      min_size=1, max_size=10).filter(lambda text: text != "NULL").map(str.encode)


@given(st.lists(st.tuples(simple_text, st.none() | simple_text), min_size=1, max_size=30))
def test_text_lines_read_back_by_produce(rows: list[tuple[bytes, bytes | None]]) -> None:
    printed = bytes(text_lines(batch_of([(key, value, None) for key, value in rows]),
                               TextFormat(null_marker=b"NULL")))
    parsed = parse_chunk(printed, LineFormat(null_marker=b"NULL"))
    assert list(zip(parsed["key"].to_pylist(), parsed["value"].to_pylist(), strict=True)) == rows


def test_text_lines_print_partition_offset_and_timestamp_first() -> None:
    batch = batch_of([(b"AAPL", b"189.20", None), (None, None, None)])
    shown = TextFormat(separator=b" ", print_partition=True, print_offset=True, print_timestamp=True)
    assert bytes(text_lines(batch, shown)) == b"1 10 1000 AAPL 189.20\n1 11 1001 null null\n"


@pytest.mark.parametrize(("chunk", "line_format", "index", "reason"), [
    (b"a\t1\nb 2\n", LineFormat(), 2, "no separator '\\t' between key and value"),
    (b'{"value": "x"}\n{"value": "y", "extra": 1}\n', LineFormat(json=True), 2, "unknown fields ['extra']"),
    (b'{"value": "x"}\n[1, 2]\n', LineFormat(json=True), 2, "not a JSON object"),
    (b'{"key": "k"}\n', LineFormat(json=True), 1, 'no "value" field'),
    (b'{"value": "x", "timestamp": "soon"}\n', LineFormat(json=True), 1, "'timestamp' is \"soon\"; expected an int"),
])
def test_the_first_malformed_line_is_named_with_the_lines_before_it(chunk: bytes, line_format: LineFormat,
                                                                    index: int, reason: str) -> None:
    with pytest.raises(LineError) as error:
        parse_chunk(chunk, line_format)
    assert error.value.line_index == index and error.value.reason.startswith(reason)
    assert error.value.parsed.num_rows == index - 1
