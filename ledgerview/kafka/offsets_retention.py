"""Kafka's ``offsets.retention.minutes``: the committed offsets of a group with no members whose last commit on a
partition is older than the retention are removed (Kafka's GroupMetadataManager.cleanupGroupMetadata), so offset
records of groups that are gone do not pile up for ever. As in Kafka since KIP-211, a group that had members keeps
its offsets for the retention after its last member left, however old its commits (a consumer of a quiet topic
commits nothing new); membership is in memory, so after a restart of the endpoint only the commits count. A group's
offsets are its subscription cursor records (ledgerview/kafka/group_offsets.py), which a ledgerview Consumer of that
subscription name shares: an idle subscription loses its position the same way. Run when the endpoint starts and
every ``offsets.retention.check.interval.ms``."""

from __future__ import annotations

import logging

from ledgerview.kafka.coordinator import GroupCoordinator
from storage import Store
from storage.cursors import read_subscription_cursor, remove_subscription_cursor, subscription_names
from storage.errors import LedgerviewError
from storage.files import partition_folder

log = logging.getLogger(__name__)


def expire_group_offsets(store: Store, coordinator: GroupCoordinator, *, retention_minutes: int, now_ms: int) -> int:
    """Remove the offsets older than ``retention_minutes`` of groups with no members that have had none for that
    long either; returns how many. Forgets when the other groups emptied, and the groups with no offsets left."""
    oldest_kept_ms = now_ms - retention_minutes * 60_000
    now_s = coordinator.clock()
    emptied_lately = {group_id for group_id, emptied_s in coordinator.emptied.items()
                      if now_s - emptied_s < retention_minutes * 60}
    with_offsets: set[str] = set()
    removed = 0
    for topic in store.list_topics():
        for partition in range(store.topic_metadata(topic).partitions):
            folder = partition_folder(store.root, topic, partition)
            for group_id in subscription_names(folder):
                with_offsets.add(group_id)
                group = coordinator.groups.get(group_id)
                if (group is not None and group.members) or group_id in emptied_lately:
                    continue
                try:
                    cursor = read_subscription_cursor(folder, group_id, partition)
                except LedgerviewError as error:  # a damaged record: verify names it, retention leaves it
                    log.warning("offsets retention skips %s: %s", folder, error)
                    continue
                if cursor is not None and cursor.updated_ms < oldest_kept_ms:
                    remove_subscription_cursor(folder, group_id)
                    removed += 1
    coordinator.emptied = {group_id: emptied_s for group_id, emptied_s in coordinator.emptied.items()
                           if group_id in emptied_lately and group_id in with_offsets}
    if removed:
        log.info("offsets.retention.minutes=%d removed %d committed offsets of empty groups", retention_minutes,
                 removed)
    return removed
