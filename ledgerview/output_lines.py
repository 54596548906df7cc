"""Messages out as lines: text built with Arrow kernels, or JSON lines (what ``consume`` prints).

Text: the chosen fields joined by the separator, ``partition offset timestamp key value`` in that order, with null
keys and values shown as the null marker (kafka-console-consumer prints ``null``) and bytes that are not UTF-8
escaped as ``\\xNN``. A batch becomes one buffer of
lines without a Python step per message. JSON: one object per message with partition, offset, timestamp, key,
value and headers; keys, values and header values are decoded as UTF-8 (invalid bytes become U+FFFD). Both are
built with Arrow kernels, a batch at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.input_lines import concatenated_values


@dataclass(frozen=True)
class TextFormat:
    separator: bytes = b"\t"
    null_marker: bytes = b"null"
    print_partition: bool = False
    print_offset: bool = False
    print_timestamp: bool = False
    print_key: bool = True


def text_lines(batch: pa.RecordBatch, text_format: TextFormat) -> memoryview:
    """The batch (MESSAGE_SCHEMA) as text lines, each ending with a newline."""
    columns = [name for name, shown in (("partition", text_format.print_partition),
                                        ("offset", text_format.print_offset),
                                        ("timestamp", text_format.print_timestamp),
                                        ("key", text_format.print_key), ("value", True)) if shown]
    null = pa.scalar(text_format.null_marker, pa.binary())
    fields = [pc.fill_null(_printable(batch.column(name)), null) for name in columns]
    line = pc.binary_join_element_wise(*fields, pa.scalar(text_format.separator, pa.binary()))
    ended = pc.binary_join_element_wise(line, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    return concatenated_values(ended)


def _printable(column: pa.Array) -> pa.Array:
    """A column as UTF-8 bytes to print: text as it is; bytes that are not UTF-8 escaped as ``\\xNN``, as kcat
    shows them (one Python step per message, only for a column that holds such bytes)."""
    try:
        return column.cast(pa.string()).cast(pa.binary())
    except pa.ArrowInvalid:
        return pa.array([None if value is None else value.decode("utf-8", "backslashreplace").encode()
                         for value in column.to_pylist()], pa.binary())


def json_lines(batch: pa.RecordBatch) -> bytes | memoryview:
    """The batch (MESSAGE_SCHEMA) as JSON lines, built with Arrow kernels; a batch whose keys, values or header
    values are not all valid UTF-8 takes the per-message path, which replaces invalid bytes."""
    try:
        return _json_lines_columnar(batch)
    except pa.ArrowInvalid:
        return json_lines_per_message(batch)


def json_lines_per_message(batch: pa.RecordBatch) -> bytes:
    """The same lines, one Python step per message (the reference the columnar path is tested against)."""
    out = []
    for row in batch.to_pylist():
        row["key"] = _text(row["key"])
        row["value"] = _text(row["value"])
        row["headers"] = [[header["key"], _text(header["value"])] for header in row["headers"] or []]
        out.append(json.dumps(row, ensure_ascii=False))
    return ("\n".join(out) + "\n").encode() if out else b""


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


_CONTROL = [chr(code) for code in range(0x20)]
_CONTROL_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_string(column: pa.Array) -> pa.Array:
    """Each value as a JSON string literal (``null`` for null), escaped as json.dumps does with ensure_ascii off;
    raises ArrowInvalid on bytes that are not UTF-8."""
    text = column.cast(pa.string())
    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
        for character in _CONTROL:
            text = pc.replace_substring(text, character, _CONTROL_ESCAPES.get(character, f"\\u{ord(character):04x}"))
    quoted = pc.binary_join_element_wise(pa.scalar('"'), text, pa.scalar('"'), pa.scalar(""))
    return pc.fill_null(quoted, pa.scalar("null"))


def _json_headers(headers: pa.Array) -> pa.Array | pa.Scalar:
    """Each message's headers as a JSON array of [key, value] pairs (one ``[]`` for a batch without any)."""
    pairs = headers.flatten()
    if len(pairs) == 0:
        return pa.scalar("[]")
    headers = pc.fill_null(headers, pa.scalar([], headers.type))
    pairs = headers.flatten()
    pair_text = pc.binary_join_element_wise(pa.scalar("["), _json_string(pairs.field("key")), pa.scalar(", "),
                                            _json_string(pairs.field("value")), pa.scalar("]"), pa.scalar(""))
    offsets = pc.subtract(headers.offsets, headers.offsets[0])
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, pair_text), ", ")
    return pc.binary_join_element_wise(pa.scalar("["), joined, pa.scalar("]"), pa.scalar(""))


def _json_lines_columnar(batch: pa.RecordBatch) -> memoryview:
    parts: list[pa.Array | pa.Scalar] = []
    for name in ("partition", "offset", "timestamp"):
        parts += [pa.scalar(f', "{name}": ' if parts else f'{{"{name}": '), batch.column(name).cast(pa.string())]
    for name in ("key", "value"):
        parts += [pa.scalar(f', "{name}": '), _json_string(batch.column(name))]
    parts += [pa.scalar(', "headers": '), _json_headers(batch.column("headers")), pa.scalar("}\n")]
    lines = pc.binary_join_element_wise(*parts, pa.scalar(""))
    return concatenated_values(lines.cast(pa.binary()))
