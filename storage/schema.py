"""The message schema and the one place where user input becomes a table of messages.

Stored batches hold ``offset, timestamp, key, value, headers``; reads add ``partition`` in front. Input may be a
pyarrow Table or RecordBatch (columns ``key``, ``value`` and optionally ``timestamp`` (a null: stamped at the
append), ``headers``, ``partition`` (a null: the partitioner's choice)), or a list of messages (mappings with those
names, or ``(key, value)`` pairs; a message without a timestamp likewise stamped at the append), converted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.errors import InvalidMessagesError

HEADER_TYPE = pa.list_(
    pa.field("item", pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))
)
STORED_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
    ]
)
MESSAGE_SCHEMA = pa.schema([pa.field("partition", pa.int32(), nullable=False), *STORED_SCHEMA])
APPENDED_SCHEMA = pa.schema(list(STORED_SCHEMA)[1:])
"""STORED_SCHEMA without its offset column: an append's messages, whose offsets follow from the log's end."""
INPUT_COLUMNS = ("key", "value", "timestamp", "headers", "partition")

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Message:
    """One message as readers hand it out; a keyed message whose value is None is a tombstone."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


_PARTITION_COLUMNS: dict[int, pa.Array] = {}
_NO_HEADERS: list[pa.Array] = []


def null_headers(rows: int) -> pa.Array:
    """A headers column of ``rows`` nulls: a zero-copy slice of a cached array whose children are empty.

    ``pa.nulls`` gives each child an offsets buffer of ``rows + 1`` zeros, which the IPC writer stores as they are
    (three 40 KB buffers in every 10,000-message batch); these children hold one offset each.
    """
    if rows == 0:
        return pa.array([], HEADER_TYPE)  # the IPC writer would store a 0-row slice's buffers whole
    cached = _NO_HEADERS[0] if _NO_HEADERS else None
    if cached is None or len(cached) < rows:
        size = max(rows, 1 << 16)
        offsets = pa.py_buffer(np.zeros(size + 1, dtype=np.int32))
        validity = pa.py_buffer(np.zeros((size + 7) // 8, dtype=np.uint8))
        cached = pa.Array.from_buffers(HEADER_TYPE, size, [validity, offsets], null_count=size,
                                       children=[pa.array([], HEADER_TYPE.value_type)])
        _NO_HEADERS[:] = [cached]
    return cached.slice(0, rows)


def with_partition_column(batch: pa.RecordBatch, partition: int) -> pa.RecordBatch:
    """A batch of STORED_SCHEMA as MESSAGE_SCHEMA: the partition column is a zero-copy slice of a cached array."""
    column = _PARTITION_COLUMNS.get(partition)
    if column is None or len(column) < batch.num_rows:
        column = pa.array(np.full(max(batch.num_rows, 1 << 16), partition, dtype=np.int32))
        _PARTITION_COLUMNS[partition] = column
    # add_column skips from_arrays' schema validation: about 2 us a batch instead of 10.
    return batch.add_column(0, MESSAGE_SCHEMA.field(0), column.slice(0, batch.num_rows))


def messages_from_table(table: pa.Table) -> list[Message]:
    """Materialise Python messages; for APIs that iterate, not for hot paths."""
    columns = table.select(["partition", "offset", "timestamp", "key", "value", "headers"]).to_pydict()
    headers = [[(h["key"], h["value"]) for h in row] if row else [] for row in columns["headers"]]
    return [
        Message(p, o, t, k, v, h)
        for p, o, t, k, v, h in zip(
            columns["partition"], columns["offset"], columns["timestamp"], columns["key"], columns["value"],
            headers, strict=True,
        )
    ]


def _to_binary(table: pa.Table, name: str) -> pa.ChunkedArray:
    column = table[name]
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.cast(column, pa.binary())
    if pa.types.is_large_binary(column.type) or pa.types.is_null(column.type):
        return pc.cast(column, pa.binary())
    raise InvalidMessagesError(f"Column {name!r} has type {column.type}; allowed: binary or string (nulls allowed).")


def _to_timestamp_ms(table: pa.Table) -> pa.ChunkedArray:
    """The timestamp column as int64 milliseconds. A null is a message without a timestamp, as when the column is
    left out: the append stamps it with its time (storage/append_path.py), so JSON lines may give a timestamp or
    not, each for itself."""
    column = table["timestamp"]
    if pa.types.is_timestamp(column.type):
        milliseconds = pc.cast(pc.cast(column, pa.timestamp("ms")), pa.int64())
    elif column.type == pa.int64():
        milliseconds = column
    elif pa.types.is_integer(column.type):
        milliseconds = _cast_checked(column, pa.int64(), "timestamp")
    else:
        raise InvalidMessagesError(
            f"Column 'timestamp' has type {column.type}; allowed: int64 milliseconds since the epoch or a timestamp."
        )
    # numpy over the values (zero-copy for one chunk without nulls): two Arrow kernel calls cost more than this at
    # 10k rows. Nulls become 0 first, which is allowed (to_numpy would make them NaN, hiding negative values).
    values = (pc.fill_null(milliseconds, 0) if milliseconds.null_count else milliseconds).to_numpy()
    if len(values) and values.min() < 0:
        negative = int(np.flatnonzero(values < 0)[0])
        raise InvalidMessagesError(
            f"Message at row {negative} has timestamp {milliseconds[negative].as_py()}; allowed: 0 or more "
            "milliseconds since the epoch (leave it out to stamp the append time)."
        )
    return milliseconds


def _cast_checked(column: pa.ChunkedArray, target: pa.DataType, name: str) -> pa.ChunkedArray:
    """Cast integers, turning an overflow into a clear error instead of Arrow's."""
    try:
        return pc.cast(column, target)
    except pa.ArrowInvalid:
        raise InvalidMessagesError(
            f"Column {name!r} has values outside {target}; allowed: integers that fit {target}."
        ) from None


def _to_headers(table: pa.Table) -> pa.ChunkedArray:
    column = table["headers"]
    try:
        return pc.cast(column, HEADER_TYPE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise InvalidMessagesError(
            f"Column 'headers' has type {column.type}; allowed: list<struct<key: string, value: binary>>."
        ) from error


def normalize_input(data: pa.Table | pa.RecordBatch | Iterable[Any]) -> pa.Table:
    """Return a table with columns key, value, timestamp (nullable while unset), headers and maybe partition."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        if not isinstance(data, Iterable) or isinstance(data, (str, bytes, Mapping)):
            raise InvalidMessagesError(
                f"Cannot append a {type(data).__name__}; give a pyarrow Table or RecordBatch, or a list of "
                "messages (mappings with 'key' and 'value', or (key, value) pairs)."
            )
        data = _table_from_messages(data)
    names = data.column_names
    unknown = [name for name in names if name not in INPUT_COLUMNS]
    if unknown:
        raise InvalidMessagesError(f"Unknown columns {unknown}; allowed: {', '.join(INPUT_COLUMNS)}.")
    if "value" not in names:
        raise InvalidMessagesError("Messages need a 'value' column (null values are tombstones).")
    rows = data.num_rows
    columns: dict[str, pa.ChunkedArray | pa.Array] = {
        "key": _to_binary(data, "key") if "key" in names else pa.nulls(rows, pa.binary()),
        "value": _to_binary(data, "value"),
        "timestamp": _to_timestamp_ms(data) if "timestamp" in names else pa.nulls(rows, pa.int64()),
        "headers": _to_headers(data) if "headers" in names else null_headers(rows),
    }
    if "partition" in names:
        if not pa.types.is_integer(data["partition"].type):
            raise InvalidMessagesError("Column 'partition' must be integers (a null: the partitioner's choice).")
        columns["partition"] = _cast_checked(data["partition"], pa.int32(), "partition")
    return pa.table(columns)


def _table_from_messages(messages: Iterable[Any]) -> pa.Table:
    keys: list[Any] = []
    values: list[Any] = []
    timestamps: list[int | None] = []
    headers: list[Any] = []
    for row, message in enumerate(messages):
        if isinstance(message, Mapping):
            unknown = set(message) - set(INPUT_COLUMNS)
            if unknown or "value" not in message:
                raise InvalidMessagesError(
                    f"Message at row {row} has fields {sorted(message)}; it needs 'value' and may have "
                    f"{', '.join(name for name in INPUT_COLUMNS if name != 'value')}."
                )
            keys.append(message.get("key"))
            values.append(message["value"])
            timestamps.append(message.get("timestamp"))
            headers.append(_header_structs(message.get("headers"), row))
        elif isinstance(message, Sequence) and not isinstance(message, (bytes, str)) and len(message) == 2:
            keys.append(message[0])
            values.append(message[1])
            timestamps.append(None)
            headers.append(None)
        else:
            raise InvalidMessagesError(
                f"Message at row {row} is a {type(message).__name__}; give a mapping with 'key' and 'value' "
                "or a (key, value) pair."
            )
    try:
        table = pa.table(
            {
                "key": _binary_array(keys),
                "value": _binary_array(values),
                "timestamp": pa.array(timestamps, pa.int64()),
                "headers": pa.array(headers, HEADER_TYPE),
            }
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
        raise InvalidMessagesError(f"Messages could not be converted: {error}") from error
    if table["timestamp"].null_count == table.num_rows:
        return table.drop_columns(["timestamp"])
    return table  # a message without a timestamp is stamped at the append, as a null in a table's column is


def _binary_array(items: list[Any]) -> pa.Array:
    encoded = [item.encode() if isinstance(item, str) else item for item in items]
    return pa.array(encoded, pa.binary())


def _header_structs(headers: Any, row: int) -> list[dict[str, Any]] | None:
    if headers is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    try:
        return [{"key": key, "value": value.encode() if isinstance(value, str) else value} for key, value in pairs]
    except (TypeError, ValueError, AttributeError) as error:
        raise InvalidMessagesError(
            f"Headers of the message at row {row} must be (str, bytes) pairs or a mapping: {error}"
        ) from error
