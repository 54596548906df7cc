"""What an append does before it writes: validate the messages, set their timestamps, choose their partitions
and the codec. Nothing here writes; the store writes the result to the partition logs under their writer locks.

The steps, in order, each raising before anything is written:

1. Sizes: no message above the topic's max.message.bytes (MessageTooLargeError).
2. Keys: a compact-only topic refuses keyless messages (KeylessMessageError).
3. Timestamps: the clock's time for every message under LogAppendTime, else for those without one.
4. Partitions: the one asked for, else the ``partition`` column, else (and for its nulls) Kafka's murmur2 of the
   key; keyless messages of one call go together to the next partition in turn (UnknownPartitionError for a wrong
   number).
5. Codec: the topic's compression.type, or the producer's choice when it is "producer" (none, lz4, zstd).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.config import TopicConfig
from storage.errors import InvalidMessagesError, KeylessMessageError, MessageTooLargeError, UnknownPartitionError
from storage.partition_log import Clock, estimated_message_bytes, estimated_total_bytes
from storage.partitioner import partition_for_keys
from storage.schema import normalize_input
from storage.topics import TopicMetadata

Input: TypeAlias = pa.Table | pa.RecordBatch | Iterable[Any]


class AppendResult(Sequence[tuple[int, int]]):
    """The (partition, offset) each appended message got, in input order; arrays kept columnar."""

    def __init__(self, partitions: np.ndarray, offsets: np.ndarray) -> None:
        self.partitions = partitions
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int]]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if isinstance(index, slice):
            return list(zip(self.partitions[index].tolist(), self.offsets[index].tolist(), strict=True))
        return int(self.partitions[index]), int(self.offsets[index])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"AppendResult({self[:5]}{'...' if len(self) > 5 else ''}, {len(self)} messages)"


@dataclass(frozen=True)
class PreparedAppend:
    """Messages ready to write."""

    table: pa.Table
    """The messages, timestamped, without a partition column."""
    sizes: np.ndarray | None
    """Each message's estimated size in bytes; None when the messages' total is within max.message.bytes (the
    partition log computes them should it need to split the table)."""
    targets: np.ndarray
    """Each message's partition (int32), in input order."""
    codec: str | None
    """"lz4", "zstd" or None (uncompressed)."""


class AppendPath:
    """The checks and choices of appends to one store; it holds the keyless round-robin turn."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._keyless_turn = itertools.count()

    def prepare(self, metadata: TopicMetadata, data: Input, partition: int | None, *,
                compression: str | None) -> PreparedAppend | None:
        """``data`` through steps 1 to 5 for ``metadata``'s topic; None when it holds no message."""
        config = metadata.config
        table = normalize_input(data)
        if table.num_rows == 0:
            return None
        sizes = _checked_sizes(metadata.name, table, config.max_message_bytes)
        if config.is_compact and not config.is_delete and table.column("key").null_count:
            raise KeylessMessageError(metadata.name, int(np.flatnonzero(
                table.column("key").is_null().to_numpy(zero_copy_only=False))[0]))
        table = self._set_timestamps(table, config)
        targets = self._choose_partitions(metadata, table, partition)
        if "partition" in table.column_names:
            table = table.drop_columns(["partition"])
        return PreparedAppend(table, sizes, targets, _choose_codec(config, compression))

    def route(self, metadata: TopicMetadata, data: Input, *, keyless_partition: int) -> pa.Table:
        """``data`` through steps 1 and 4 (keyless messages to ``keyless_partition``), with a ``partition`` column
        saying where each message goes and no timestamp column if none was given."""
        table = normalize_input(data)
        _checked_sizes(metadata.name, table, metadata.config.max_message_bytes)
        targets = self._choose_partitions(metadata, table, None, keyless_partition=keyless_partition)
        unset = [name for name in ("partition", "timestamp") if name in table.column_names
                 and (name == "partition" or table.column(name).null_count == table.num_rows)]
        return table.drop_columns(unset).append_column("partition", pa.array(targets, pa.int32()))

    def _set_timestamps(self, table: pa.Table, config: TopicConfig) -> pa.Table:
        timestamps = table.column("timestamp")
        if config.message_timestamp_type == "LogAppendTime" or timestamps.null_count:
            now = pa.scalar(self._clock(), pa.int64())
            filled = pa.chunked_array([pa.repeat(now, table.num_rows)]) if (
                config.message_timestamp_type == "LogAppendTime") else pc.fill_null(timestamps, now)
            table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", filled)
        return table

    def _choose_partitions(self, metadata: TopicMetadata, table: pa.Table, partition: int | None, *,
                           keyless_partition: int | None = None) -> np.ndarray:
        count = metadata.partitions
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
                raise UnknownPartitionError(metadata.name, partition, count)
            return np.full(table.num_rows, partition, dtype=np.int32)
        given = table.column("partition").combine_chunks() if "partition" in table.column_names else None
        if given is not None:
            named = pc.drop_null(given).to_numpy()
            bad = np.flatnonzero((named < 0) | (named >= count))
            if len(bad):
                raise UnknownPartitionError(metadata.name, int(named[bad[0]]), count)
            if not given.null_count:
                return np.asarray(named, dtype=np.int32)
        chosen = self._partitioner_choice(table, count, keyless_partition)
        if given is not None:  # the messages that name their partition keep it
            chosen[given.is_valid().to_numpy(zero_copy_only=False)] = named
        return chosen

    def _partitioner_choice(self, table: pa.Table, count: int, keyless_partition: int | None) -> np.ndarray:
        """Kafka's murmur2 of the key; keyless messages of one call together to the next partition in turn (or to
        ``keyless_partition``)."""
        keyless_target = next(self._keyless_turn) if keyless_partition is None else keyless_partition
        chosen = np.full(table.num_rows, keyless_target % count, dtype=np.int32)
        if count == 1:
            return chosen
        keys = table.column("key").combine_chunks()
        if not keys.null_count:
            return partition_for_keys(keys, count)
        keyless = keys.is_null().to_numpy(zero_copy_only=False)
        if not keyless.all():
            keyed = np.flatnonzero(~keyless)
            chosen[keyed] = partition_for_keys(keys.take(pa.array(keyed)), count)
        return chosen


def _checked_sizes(topic: str, table: pa.Table, limit_bytes: int) -> np.ndarray | None:
    """Each message's estimated size, having checked none is over ``limit_bytes``; None, without sizing each
    message, when all of them together are within it (an append's usual case)."""
    if estimated_total_bytes(table) <= limit_bytes:
        return None
    sizes = estimated_message_bytes(table)
    too_big = np.flatnonzero(sizes > limit_bytes)
    if len(too_big):
        row = int(too_big[0])
        raise MessageTooLargeError(topic, row, int(sizes[row]), limit_bytes)
    return sizes


def _choose_codec(config: TopicConfig, compression: str | None) -> str | None:
    codec = compression if config.compression_type == "producer" else config.compression_type
    codec = None if codec in (None, "uncompressed", "none") else codec
    if codec not in (None, "lz4", "zstd"):
        raise InvalidMessagesError(f"compression {compression!r} is not supported; allowed: lz4, zstd, none.")
    return codec
