"""Kafka topic names as the endpoint serves them: every stored topic under its own name (the raw log) and under
``<topic><suffix>`` (its compacted view, read-only), so any Kafka consumer can read Pulsar's compacted view.

A stored topic whose name already ends with the suffix is served as itself when no topic of the shorter name
exists; otherwise the name means the shorter topic's compacted view.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage import Store
from storage.errors import InvalidTopicNameError, UnknownTopicError
from storage.files import validate_topic_name


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


def resolve_topic(store: Store, name: str, suffix: str) -> TopicView:
    """The view ``name`` serves; raises InvalidTopicNameError or UnknownTopicError."""
    validate_topic_name(name)
    if suffix and name.endswith(suffix) and len(name) > len(suffix):
        base = name[: -len(suffix)]
        try:
            return TopicView(name, base, True, store.topic_metadata(base).partitions)
        except (UnknownTopicError, InvalidTopicNameError):
            pass
    return TopicView(name, name, False, store.topic_metadata(name).partitions)


def all_topic_views(store: Store, suffix: str) -> list[TopicView]:
    """Every topic under both names (the compacted one only when a suffix is configured)."""
    views = []
    for topic in store.list_topics():
        partitions = store.topic_metadata(topic).partitions
        views.append(TopicView(topic, topic, False, partitions))
        if suffix:
            views.append(TopicView(topic + suffix, topic, True, partitions))
    return views
