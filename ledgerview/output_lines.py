"""Messages out as lines: text built with Arrow kernels, or JSON lines (what ``consume`` prints).

Text: the chosen fields joined by the separator, ``partition offset timestamp key value`` in that order, with null
keys and values shown as the null marker (kafka-console-consumer prints ``null``). A batch becomes one buffer of
lines without a Python step per message. JSON: one object per message with partition, offset, timestamp, key,
value and headers; keys, values and header values are decoded as UTF-8 (invalid bytes become U+FFFD).
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
    fields = [pc.fill_null(batch.column(name).cast(pa.string()).cast(pa.binary()), null) for name in columns]
    line = pc.binary_join_element_wise(*fields, pa.scalar(text_format.separator, pa.binary()))
    ended = pc.binary_join_element_wise(line, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    return concatenated_values(ended)


def json_lines(batch: pa.RecordBatch) -> bytes:
    """The batch (MESSAGE_SCHEMA) as JSON lines. One Python step per message: JSON escaping has no Arrow kernel."""
    out = []
    for row in batch.to_pylist():
        row["key"] = _text(row["key"])
        row["value"] = _text(row["value"])
        row["headers"] = [[header["key"], _text(header["value"])] for header in row["headers"] or []]
        out.append(json.dumps(row))
    return ("\n".join(out) + "\n").encode() if out else b""


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")
