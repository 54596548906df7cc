"""Produce requests v3-v8 (the non-flexible versions the endpoint handles) read without copying their records:
each partition's records are a memoryview of the request frame, where kafka-python's ProduceRequest.decode copies
them into a bytes object (a megabyte per request, and a fresh allocation each time).

Fields as Kafka's ProduceRequest.json: transactional_id (nullable string), acks (int16), timeout_ms (int32), then
an array of topics, each a name (string) and an array of partitions, each an index (int32) and records (nullable
bytes). A request that does not parse raises ValueError or struct.error, as kafka-python's decode does, and the
endpoint closes the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_ACKS_TIMEOUT: Final = struct.Struct(">hi")


@dataclass(frozen=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(frozen=True)
class TopicProduceData:
    name: str
    partition_data: list[PartitionProduceData]


@dataclass(frozen=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class ProduceRequest:
    """Stands for kafka-python's ProduceRequest in the endpoint's table of request classes (protocol.py)."""

    @staticmethod
    def decode(body: bytes | memoryview, *, version: int) -> ProduceRequestData:
        reader = _Reader(memoryview(body))
        transactional_id = reader.string(nullable=True)
        acks, timeout_ms = reader.unpack(_ACKS_TIMEOUT)
        topics = []
        for _ in range(reader.count()):
            name = reader.string(nullable=False)
            partitions = [PartitionProduceData(reader.unpack(_INT32)[0], reader.nullable_bytes())
                          for _ in range(reader.count())]
            topics.append(TopicProduceData(name or "", partitions))
        return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._position = 0

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        values = layout.unpack_from(self._data, self._position)
        self._position += layout.size
        return values

    def count(self) -> int:
        (count,) = self.unpack(_INT32)
        if count < 0:
            raise ValueError(f"an array of {count} elements")
        return count

    def string(self, *, nullable: bool) -> str | None:
        (length,) = self.unpack(_INT16)
        if length < 0:
            if nullable:
                return None
            raise ValueError("a null string where one is required")
        return str(self._take(length), "utf-8")

    def nullable_bytes(self) -> memoryview | None:
        (length,) = self.unpack(_INT32)
        return None if length < 0 else self._take(length)

    def _take(self, length: int) -> memoryview:
        end = self._position + length
        if end > len(self._data):
            raise ValueError(f"{length} bytes wanted, {len(self._data) - self._position} left")
        view = self._data[self._position : end]
        self._position = end
        return view
