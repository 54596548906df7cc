"""Consumer groups and subscriptions, managed: list, describe with lag, reset offsets, delete (Kafka's
kafka-consumer-groups; Pulsar's topics subscriptions, stats, reset-cursor and unsubscribe).

A Kafka group's committed offsets and a ledgerview Consumer's durable subscription are one thing on disk: a
subscription cursor record per partition (storage/cursors.py), named by the group or subscription. So one set of
tools serves both, from Python, the command line and the Kafka endpoint's admin requests.

Lag is Kafka's: the partition's end offset minus the committed offset. A position taken on the compacted view also
has its compacted lag: the messages of that view still to read (the ledger's from the position up to the horizon,
then the raw tail), which is what a consumer of the compacted view actually has left.

Resetting writes new positions whatever the group is doing: a member that is consuming now commits over them, as
in Kafka, whose tool refuses to reset an active group; stop the group's consumers first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from storage import Store
from storage.compacted import CompactedLedgers
from storage.cursors import (
    SubscriptionCursor,
    read_subscription_cursor,
    remove_subscription_cursor,
    subscription_names,
    validate_subscription_name,
    write_subscription_cursor,
)
from storage.errors import CorruptDataError, LedgerviewError, UnknownTopicError
from storage.files import partition_folder, partitions_on_disk

ResetKind = Literal["earliest", "latest", "offset", "datetime", "shift-by"]


class UnknownGroupError(LedgerviewError):
    def __init__(self, group: str, known: list[str]) -> None:
        self.group = group
        super().__init__(f"No group or subscription named {group!r} has a position on any partition; known: "
                         f"{', '.join(known) or 'none'}.")


class InvalidResetError(LedgerviewError):
    def __init__(self, topic: str, partition: int, wanted: int, earliest: int, latest: int) -> None:
        super().__init__(f"Cannot reset to offset {wanted} on {topic}-{partition}: it holds offsets {earliest} to "
                         f"{latest} (the end; the compacted view starts at 0). Nothing was reset.")


@dataclass(frozen=True)
class GroupPosition:
    """Where a group stands on one partition."""

    topic: str
    partition: int
    committed: int | None
    """The next offset the group reads; None when the group's position record on the partition is damaged
    (``error``)."""
    end_offset: int | None
    """None when the partition's log or the position record cannot be read (``error``)."""
    read_compacted: bool | None
    """Whether the position was taken on the compacted view (None: its record is damaged)."""
    updated_ms: int | None
    """When the position was written (None: its record is damaged)."""
    compacted_lag: int | None
    """Messages of the compacted view from the position to the end; None for a position on the raw log, or when
    the partition's data or the position record cannot be read."""
    error: str | None = None
    """Why the partition's stored data or the group's position record on it cannot be read (a damaged segment,
    ledger or cursor record): what depends on it is then unknown, and the group's other positions are still
    described."""

    @property
    def lag(self) -> int | None:
        return None if self.end_offset is None or self.committed is None else max(0, self.end_offset - self.committed)


@dataclass(frozen=True)
class ResetTo:
    """Where ``reset_offsets`` moves a group: ``earliest``, ``latest``, an ``offset``, the first offset at or
    after a ``datetime`` (``value`` in epoch milliseconds), or ``shift-by`` ``value`` from the committed offset."""

    kind: ResetKind
    value: int = 0


@dataclass(frozen=True)
class Reset:
    topic: str
    partition: int
    before: int | None
    """The committed offset before the reset; None where the group had no position."""
    after: int


def list_groups(store: Store) -> list[str]:
    """Every group or subscription with a position on some partition, sorted; from the partitions' folders, whose
    logs need not open (a damaged one still lists its groups)."""
    names: set[str] = set()
    for topic, partition in _partitions(store, store.list_topics()):
        names.update(subscription_names(partition_folder(store.root, topic, partition)))
    return sorted(names)


def describe_group(store: Store, group: str) -> list[GroupPosition]:
    """The group's position on every partition it has one on, with lag; a partition whose data or position record
    cannot be read is described with its error instead of what that leaves unknown."""
    validate_subscription_name(group)
    positions = []
    for topic, partition in _partitions(store, store.list_topics()):
        try:
            cursor = read_subscription_cursor(partition_folder(store.root, topic, partition), group, partition)
        except CorruptDataError as failure:
            positions.append(GroupPosition(topic, partition, None, None, None, None, None, _described(failure)))
            continue
        if cursor is None:
            continue
        try:
            end = store.end_offset(topic, partition)
            compacted_lag = _compacted_lag(store, topic, partition, cursor.acked_offset, end) if (
                cursor.read_compacted) else None
        except CorruptDataError as failure:
            positions.append(GroupPosition(topic, partition, cursor.acked_offset, None, cursor.read_compacted,
                                           cursor.updated_ms, None, _described(failure)))
            continue
        positions.append(GroupPosition(topic, partition, cursor.acked_offset, end, cursor.read_compacted,
                                       cursor.updated_ms, compacted_lag))
    if not positions:
        raise UnknownGroupError(group, list_groups(store))
    return positions


def _described(failure: CorruptDataError) -> str:
    return f"{type(failure).__name__}: {failure}"


def reset_offsets(store: Store, group: str, topic: str, to: ResetTo, *, partitions: Iterable[int] | None = None,
                  dry_run: bool = False) -> list[Reset]:
    """Move the group's positions on ``topic`` (every partition, or ``partitions``); with ``dry_run`` only say
    where. Every target is checked before any position is written. The new positions name no ledger, so a
    compacted consumer continues on the raw log from there and misses no tombstone."""
    validate_subscription_name(group)
    chosen = list(range(store.topic_metadata(topic).partitions)) if partitions is None else list(partitions)
    planned: list[tuple[Reset, SubscriptionCursor | None]] = []
    for partition in chosen:
        folder = store.partition_log(topic, partition).folder
        cursor = read_subscription_cursor(folder, group, partition)
        compacted = cursor is not None and cursor.read_compacted
        earliest = 0 if compacted else store.start_offset(topic, partition)
        latest = store.end_offset(topic, partition)
        before = None if cursor is None else cursor.acked_offset
        after = _target(store, topic, partition, to, before, earliest, latest)
        if not earliest <= after <= latest:
            raise InvalidResetError(topic, partition, after, earliest, latest)
        planned.append((Reset(topic, partition, before, after), cursor))
    if not dry_run:
        for reset, cursor in planned:
            folder = store.partition_log(topic, reset.partition).folder
            compacted = cursor is not None and cursor.read_compacted
            write_subscription_cursor(folder, SubscriptionCursor(group, reset.partition, reset.after, compacted,
                                                                     None, store.clock()))
    return [reset for reset, _ in planned]


def delete_group(store: Store, group: str, topics: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """Forget the group's positions (on ``topics`` only, if given: Kafka's OffsetDelete); returns the partitions
    it had one on."""
    validate_subscription_name(group)
    chosen = store.list_topics() if topics is None else list(topics)
    if topics is not None:
        for topic in chosen:
            store.topic_metadata(topic)  # an unknown topic named by the caller is an error, not nothing to do
    removed = []
    for topic, partition in _partitions(store, chosen):
        if remove_subscription_cursor(store.partition_log(topic, partition).folder, group):
            removed.append((topic, partition))
    if not removed and group not in list_groups(store):  # none at all, named topics or not
        raise UnknownGroupError(group, list_groups(store))
    return removed


def _target(store: Store, topic: str, partition: int, to: ResetTo, before: int | None, earliest: int,
            latest: int) -> int:
    if to.kind == "earliest":
        return earliest
    if to.kind == "latest":
        return latest
    if to.kind == "offset":
        return to.value
    if to.kind == "datetime":
        found = store.offset_for_timestamp(topic, partition, to.value)
        return latest if found is None else max(found, earliest)
    start = earliest if before is None else before
    return min(max(start + to.value, earliest), latest)  # shift-by: clamped, as Kafka's tool does


def _compacted_lag(store: Store, topic: str, partition: int, position: int, end: int) -> int:
    opened = CompactedLedgers(store.partition_log(topic, partition).folder).open_current(verify=False)
    if opened is None:
        return max(0, end - position)
    cursor, ledger = opened
    try:
        in_ledger = sum(batch.num_rows for batch in ledger.read_batches(position)) if (
            position <= cursor.horizon) else 0
    finally:
        ledger.close()
    tail_start = max(position, cursor.horizon + 1, store.start_offset(topic, partition))
    return in_ledger + max(0, end - tail_start)


def _partitions(store: Store, topics: Iterable[str]) -> list[tuple[str, int]]:
    """The topics' partitions; for a topic whose metadata record is damaged, the partition folders it has (their
    positions are then described with that error)."""
    found = []
    for topic in topics:
        try:
            found += [(topic, partition) for partition in range(store.topic_metadata(topic).partitions)]
        except UnknownTopicError:
            continue  # deleted meanwhile
        except CorruptDataError:
            found += [(topic, partition) for partition in partitions_on_disk(store.root, topic)]
    return found
