"""The topic metadata record: a topic's partition count and config overrides, one JSON file per topic.

The file's existence is what makes a topic exist: creating writes it last (after the partition folders),
deleting removes it first, so a crash in between leaves folders that the next open removes, never a half topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from storage.config import TopicConfig
from storage.errors import CorruptDataError
from storage.fileio import write_atomically
from storage.files import validate_topic_name
from storage.records import CorruptRecordError, decode_record, encode_record

TOPIC_RECORD = "topic"
FORMAT_VERSION = 2
"""1: the unchecksummed record of earlier releases (still read); 2: storage/records.py's format."""


class CorruptTopicMetadataError(CorruptDataError):
    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"Topic metadata {path} is unreadable: {reason}.")


@dataclass(frozen=True)
class TopicMetadata:
    """What defines a topic, as stored."""

    name: str
    """The topic name, valid by Kafka's rules."""
    partitions: int
    """Number of partitions, at least 1; fixed at creation."""
    overrides: dict[str, str]
    """Config keys set for this topic; every other key has its default."""
    created_ms: int
    """Wall-clock creation time."""

    @cached_property
    def config(self) -> TopicConfig:
        """The effective config, parsed once per metadata record."""
        return TopicConfig.from_overrides(self.overrides)

    def encode(self) -> bytes:
        return encode_record(TOPIC_RECORD, FORMAT_VERSION, {"name": self.name, "partitions": self.partitions,
                                                            "config": self.overrides, "created_ms": self.created_ms})

    @classmethod
    def decode(cls, path: Path | str, data: bytes) -> TopicMetadata:
        """The record read from ``path`` (a file or a remote tier's object, named in errors)."""
        try:
            _, record = decode_record(path, data, TOPIC_RECORD, max_version=FORMAT_VERSION, legacy=True)
            metadata = cls(validate_topic_name(record["name"]), int(record["partitions"]),
                           {str(k): str(v) for k, v in record["config"].items()}, int(record["created_ms"]))
        except CorruptRecordError as error:
            raise CorruptTopicMetadataError(path, error.reason) from error
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CorruptTopicMetadataError(path, str(error)) from error
        if metadata.partitions < 1:
            raise CorruptTopicMetadataError(path, f"partitions is {metadata.partitions}")
        return metadata

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, self.encode())
