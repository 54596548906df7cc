"""Kafka topic names as the endpoint serves them: every stored topic under its own name (the raw log) and under
``<topic><suffix>`` (its compacted view, read-only), so any Kafka consumer can read Pulsar's compacted view.

A stored topic whose name already ends with the suffix is served as itself when no topic of the shorter name
exists; otherwise the name means the shorter topic's compacted view.

A partition whose stored data fails its checks (storage.errors.CorruptDataError: a damaged batch where its log is
recovered, a damaged ledger, checkpoint or cursor record) is answered KAFKA_STORAGE_ERROR in that partition's entry,
as Kafka answers a partition of an offline log dir, and logged with the file the error names; the request's other
partitions, and the connection, are served as usual (``unreadable``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ledgerview.kafka.protocol import ErrorCode
from storage import Store
from storage.errors import CorruptDataError, InvalidTopicNameError, UnknownTopicError
from storage.files import validate_topic_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicView:
    """What one Kafka topic name serves."""

    name: str
    """The name clients use."""
    topic: str
    """The stored topic."""
    compacted: bool
    """Whether the name serves the compacted view (read-only) rather than the raw log."""
    partitions: int
    created_ms: int
    """The stored topic's creation time: a topic deleted and created again under its name is another log, whose
    offsets hold other messages."""


def resolve_topic(store: Store, name: str, suffix: str) -> TopicView:
    """The view ``name`` serves; raises InvalidTopicNameError or UnknownTopicError."""
    validate_topic_name(name)
    if suffix and name.endswith(suffix) and len(name) > len(suffix):
        base = name[: -len(suffix)]
        try:
            metadata = store.topic_metadata(base)
            return TopicView(name, base, True, metadata.partitions, metadata.created_ms)
        except (UnknownTopicError, InvalidTopicNameError):
            pass
    metadata = store.topic_metadata(name)
    return TopicView(name, name, False, metadata.partitions, metadata.created_ms)


def all_topic_views(store: Store, suffix: str) -> tuple[list[TopicView], list[str]]:
    """Every topic under both names (the compacted one only when a suffix is configured), and the names of those
    whose metadata record is damaged (``unreadable`` logs why): one such topic hides no other."""
    views, damaged = [], []
    for topic in store.list_topics():
        names = [topic, topic + suffix] if suffix else [topic]
        try:
            metadata = store.topic_metadata(topic)
        except UnknownTopicError:
            continue  # deleted since the listing
        except CorruptDataError as error:
            unreadable(topic, None, error)
            damaged += names
            continue
        views += [TopicView(name, topic, name != topic, metadata.partitions, metadata.created_ms) for name in names]
    return views, damaged


def unreadable(name: str, partition: int | None, error: CorruptDataError) -> ErrorCode:
    """KAFKA_STORAGE_ERROR for partition ``partition`` of ``name`` (None: the whole topic, whose metadata record is
    damaged), whose stored data failed its checks; logs the
    error, which names the file, as an error once per partition and error in REPORT_EVERY_S, at debug level
    between (clients retry such a partition every 100 ms or so, which would fill the log)."""
    seen = (name, -1 if partition is None else partition, str(error))
    now = time.monotonic()
    recent = seen in _REPORTED and now - _REPORTED[seen] < REPORT_EVERY_S
    if not recent:
        _REPORTED[seen] = now
    log.log(logging.DEBUG if recent else logging.ERROR, "answering KAFKA_STORAGE_ERROR for %s: %s",
            name if partition is None else f"{name}-{partition}", error)
    return ErrorCode.KAFKA_STORAGE_ERROR


REPORT_EVERY_S = 600.0
_REPORTED: dict[tuple[str, int, str], float] = {}
"""When each partition's error was last logged as an error: as many entries as partitions found damaged."""
