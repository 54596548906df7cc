"""Lines of text into tables of messages, columnar: what ``produce`` and the directory source read.

Two formats:

- text: ``key<separator>value`` per line (the separator is a tab by default; the value may contain it), or only a
  value per line when there are no keys. A key or value equal to the null marker is null: a keyed message with a
  null value is a tombstone.
- json: one object per line with ``value`` (a string, or null for a tombstone) and optionally ``key`` (a string or
  null), ``timestamp`` (integer milliseconds) and ``partition``, each line for itself: a line without a timestamp
  (or with null) gets the time of the append, one without a partition the partitioner's choice.

Input is handled in chunks that end at a line end. A chunk is split and parsed with Arrow kernels; only when a
chunk may hold a malformed line is it walked line by line (JSON: with the json module, whose rules decide), to
name the first bad line exactly.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from storage.binary_arrays import value_offsets

CHUNK_BYTES = 8 * 1024 * 1024
JSON_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string()), ("timestamp", pa.int64()),
                         ("partition", pa.int32())])
INTEGER_FIELDS = {name: int(np.iinfo(JSON_SCHEMA.field(name).type.to_pandas_dtype()).max)
                  for name in ("timestamp", "partition")}
"""The integer fields of a JSON line and the largest value each takes (its column's); the smallest is 0."""
JSON_FIELDS = {
    "key": "a string or null",
    "value": "a string or null (a tombstone)",
    "timestamp": f"an integer from 0 to {INTEGER_FIELDS['timestamp']} (milliseconds since the epoch), or null "
                 "for the time of the append",
    "partition": f"an integer from 0 to {INTEGER_FIELDS['partition']}, or null for the partitioner's choice",
}
"""Each field of a JSON line and what it takes; a field left out is as if null (only "value" must be given). The
Spark directory source (ledgerview/service/spark_ingest.py) checks lines by these too."""
NO_VALUE = 'no "value" field (give "value": null for a tombstone)'
"""Why a JSON line without a "value" field is refused."""


@dataclass(frozen=True)
class LineFormat:
    """How lines become messages."""

    json: bool = False
    """One JSON object per line instead of text."""
    separator: bytes = b"\t"
    """Between key and value in text lines."""
    keyed: bool = True
    """Text lines hold a key and a value; False: the whole line is the value and the key is null."""
    null_marker: bytes | None = None
    """A text key or value equal to this is null (a null value is a tombstone); None: no marker."""


class LineError(ValueError):
    """The first malformed line of a chunk: its number within the chunk (from 1) and what is wrong."""

    def __init__(self, line_index: int, line: bytes, reason: str, parsed: pa.Table) -> None:
        self.line_index, self.line, self.reason = line_index, line, reason
        self.parsed = parsed
        """The messages of the lines before the bad one."""
        super().__init__(reason)


class LineTooLongError(Exception):
    """A line longer than ``read_chunks`` was told to read; ``start``: its first bytes (81, so that an error shows
    it is cut)."""

    def __init__(self, start: bytes) -> None:
        super().__init__("a line longer than the bound")
        self.start = start


def read_chunks(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES, *, max_line_bytes: int | None = None) -> (
    Iterator[bytes]
):
    """Blocks of whole lines (the last one may lack its line end). A line found longer than ``max_line_bytes``
    raises LineTooLongError once a chunk past the bound is read, instead of being gathered whole."""
    rest = b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            if rest:
                yield rest
            return
        block = rest + block
        cut = block.rfind(b"\n") + 1
        if cut == 0:
            if max_line_bytes is not None and len(block) >= max_line_bytes:  # its line end is still to come
                raise LineTooLongError(block[:81])
            rest = block
            continue
        rest = block[cut:]
        yield block[:cut]


def split_lines(chunk: bytes) -> pa.Array:
    """The chunk's lines without their line ends (``\\n`` or ``\\r\\n``), blank lines dropped."""
    if b"\r\n" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    lines = pc.split_pattern(pa.array([chunk], pa.binary()), b"\n").values
    return lines.filter(pc.greater(pc.binary_length(lines), 0))


def line_number_in(chunk: bytes, non_blank_index: int) -> int:
    """The line number within ``chunk`` of its ``non_blank_index``-th non-blank line (both from 1); for error
    messages only, so a plain walk."""
    seen = 0
    for number, line in enumerate(chunk.split(b"\n"), start=1):
        if line.strip(b"\r"):
            seen += 1
            if seen == non_blank_index:
                return number
    return non_blank_index


def parse_chunk(chunk: bytes, line_format: LineFormat) -> pa.Table:
    """The messages of a chunk's lines (columns key, value and, for JSON, timestamp and partition when given);
    raises LineError at the first malformed line."""
    lines = split_lines(chunk)
    if line_format.json:
        return _parse_json(lines)
    return _parse_text(lines, line_format)


def _parse_text(lines: pa.Array, line_format: LineFormat) -> pa.Table:
    if not line_format.keyed:
        return pa.table({"key": pa.nulls(len(lines), pa.binary()), "value": _nulls_marked(lines, line_format)})
    parts = pc.split_pattern(lines, line_format.separator, max_splits=1)
    unsplit = np.flatnonzero(pc.list_value_length(parts).to_numpy(zero_copy_only=False) < 2)
    if len(unsplit):
        bad = int(unsplit[0])
        good = _parse_text(lines.slice(0, bad), line_format)
        raise LineError(bad + 1, lines[bad].as_py(),
                        f"no separator {line_format.separator.decode()!r} between key and value", good)
    return pa.table({"key": _nulls_marked(pc.list_element(parts, 0), line_format),
                     "value": _nulls_marked(pc.list_element(parts, 1), line_format)})


def _nulls_marked(column: pa.Array, line_format: LineFormat) -> pa.Array:
    if line_format.null_marker is None:
        return column
    marked = pc.equal(column, pa.scalar(line_format.null_marker, pa.binary()))
    return pc.if_else(marked, pa.scalar(None, pa.binary()), column)


def _parse_json(lines: pa.Array) -> pa.Table:
    table = _read_json_fast(lines)
    return _json_messages(table) if table is not None else _read_json_lines(lines)


def _read_json_fast(lines: pa.Array) -> pa.Table | None:
    """The chunk by Arrow's JSON reader, or None when a line may break the rules of ``_json_record``: Arrow refused
    the chunk, or it read what those rules refuse (two objects on one line, a line without a "value" field, which
    it reads as a null value, a negative timestamp or partition)."""
    try:
        table = pa_json.read_json(io.BytesIO(_concatenated(lines)), parse_options=pa_json.ParseOptions(
            explicit_schema=JSON_SCHEMA, unexpected_field_behavior="error"))
    except pa.ArrowInvalid:
        return None
    # Inside a JSON string a quote is escaped, so `"value":` is a field name. A line that spells it otherwise
    # (`"value" :`, `"\u0076alue":`) takes the slow path, which reads it right.
    if table.num_rows != len(lines) or not pc.all(pc.match_substring(lines, b'"value":')).as_py():
        return None
    for name in INTEGER_FIELDS:
        lowest = pc.min(table[name]).as_py()
        if lowest is not None and lowest < 0:
            return None
    return table


def _read_json_lines(lines: pa.Array) -> pa.Table:
    """The slow path, for a chunk the fast one does not take: line by line with the json module, raising LineError
    at the first bad line; when there is none (a line Arrow reads otherwise, such as a field name written with
    ``\\u`` escapes), the messages are built from these records."""
    records: list[dict[str, Any]] = []
    for index, line in enumerate(lines.to_pylist()):
        record = _json_record(line)
        if isinstance(record, str):
            raise LineError(index + 1, line, record, _json_messages(pa.Table.from_pylist(records, JSON_SCHEMA)))
        records.append(record)
    return _json_messages(pa.Table.from_pylist(records, JSON_SCHEMA))


def _json_messages(table: pa.Table) -> pa.Table:
    """Key and value as binary; timestamp and partition only when some line gives them (a null in them is a line
    without one, which the append stamps with its time or gives the partitioner)."""
    columns = {"key": table["key"].cast(pa.binary()), "value": table["value"].cast(pa.binary())}
    for optional in INTEGER_FIELDS:
        if table[optional].null_count < table.num_rows:
            columns[optional] = table[optional]
    return pa.table(columns)


def _json_record(line: bytes) -> dict[str, Any] | str:
    """The fields of one JSON line, or why it is not a message."""
    repeated: list[str] = []  # a field named twice: the json module would keep the last, Arrow refuses the line

    def fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in pairs]
        repeated.extend(name for name in names if names.count(name) > 1)
        return dict(pairs)

    try:
        record = json.loads(line, object_pairs_hook=fields)
    except ValueError as error:
        return f"not JSON ({error})"
    if repeated:
        return f"the field {repeated[0]!r} is given twice"
    if not isinstance(record, dict):
        return "not a JSON object"
    unknown = sorted(set(record) - set(JSON_FIELDS))
    if unknown:
        return f"unknown fields {unknown}; allowed: {', '.join(JSON_FIELDS)}"
    if "value" not in record:
        return NO_VALUE
    for name, value in record.items():
        if not _allowed(name, value):
            return f"{name!r} is {json.dumps(value)}; expected {JSON_FIELDS[name]}"
        if isinstance(value, str) and not _is_unicode(value):
            return f"{name!r} holds a lone surrogate escape (\\ud800 to \\udfff unpaired), which is not text"
    return record


def _allowed(name: str, value: object) -> bool:
    """Whether ``value`` is what JSON_FIELDS says field ``name`` takes."""
    if value is None:
        return True
    if name not in INTEGER_FIELDS:
        return isinstance(value, str)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INTEGER_FIELDS[name]


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _concatenated(lines: pa.Array) -> bytes:
    """The lines joined by line ends, in one copy."""
    joined = pc.binary_join_element_wise(lines, pa.scalar(b""), pa.scalar(b"\n"))
    return concatenated_values(joined).tobytes()


def concatenated_values(array: pa.Array) -> memoryview:
    """The bytes of a binary array without nulls, back to back, straight from its data buffer (no copy)."""
    if len(array) == 0:
        return memoryview(b"")
    offsets = value_offsets(array)
    data = array.buffers()[2]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]
