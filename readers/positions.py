"""Where a read starts: the position kinds users give, and the one the readers keep between reads.

Users name a start as ``"earliest"``/``EARLIEST``, ``"latest"``/``LATEST``, an ``int`` offset, a ``Timestamp`` (ms),
or a mapping from partition to one of those. Ints always mean offsets; a timestamp is always wrapped, so the two
can never be confused.

Between two reads of the same reader (and in a subscription's cursor record) the position is a ``Resume``: the
next offset to deliver plus the compacted ledger the messages below it were read from. A user's start is resolved
against the view when a read opens (storage state can change between the call and the read); a ``Resume`` is
resolved by the continuation rules in readers/partition_read.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from readers.errors import InvalidPositionError


@dataclass(frozen=True)
class Earliest:
    """The first message of the view: the whole compacted ledger, or the raw log start."""


@dataclass(frozen=True)
class Latest:
    """The end offset when the read opens: only messages appended after it."""


@dataclass(frozen=True)
class Timestamp:
    """The first message whose timestamp is at or after ``timestamp_ms`` (Kafka's offsetsForTimes)."""

    timestamp_ms: int
    """Milliseconds since the epoch, compared with the messages' timestamps (CreateTime or LogAppendTime)."""


@dataclass(frozen=True)
class Resume:
    """Where a reader or subscription continues: internal, never given by users."""

    offset: int
    """The next offset to deliver; every message of the view below it has been delivered."""
    ledger_id: int | None
    """The compacted ledger the messages below ``offset`` were read from; None when they came from the raw log
    (or nothing was read). Continuing on the same ledger is exact; on another one it could skip tombstones."""
    acknowledged: bool = False
    """The position is a stored acknowledgement: messages at and above ``offset`` may have been received (and
    acted on) without being acknowledged, so offset 0 is no proof that nothing was read."""


EARLIEST = Earliest()
LATEST = Latest()

SinglePosition: TypeAlias = Literal["earliest", "latest"] | Earliest | Latest | Timestamp | int
StartPosition: TypeAlias = SinglePosition | Mapping[int, SinglePosition]
Position: TypeAlias = Earliest | Latest | Timestamp | int | Resume
"""A position after parsing, one partition's."""


def parse_single(value: object) -> Earliest | Latest | Timestamp | int:
    """Turn a user's position for one partition into its kind, or explain what is allowed."""
    if value == "earliest" or isinstance(value, Earliest):
        return EARLIEST
    if value == "latest" or isinstance(value, Latest):
        return LATEST
    if isinstance(value, Timestamp):
        if isinstance(value.timestamp_ms, bool) or not isinstance(value.timestamp_ms, int):
            raise InvalidPositionError(value, "Timestamp takes integer milliseconds since the epoch")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidPositionError(value, "offsets are >= 0")
        return value
    raise InvalidPositionError(value, "it is not a position")


def positions_per_partition(start: object, partitions: Iterable[int]) -> dict[int, Position]:
    """One parsed position per partition read; a mapping may leave partitions out: they start at the earliest."""
    chosen = list(partitions)
    if isinstance(start, Mapping):
        unknown = sorted(set(start) - set(chosen))
        if unknown:
            raise InvalidPositionError(start, f"it names partitions {unknown} that are not read (reading {chosen})")
        return {partition: parse_single(start.get(partition, EARLIEST)) for partition in chosen}
    single = parse_single(start)
    return dict.fromkeys(chosen, single)
