"""File and folder names of the store: the only module that builds or parses a path inside a data folder.

Kafka's conventions: a partition folder is ``<topic>-<partition>``; a segment's files are named by its base offset
zero-padded to 20 digits with the suffixes ``.log``, ``.index`` and ``.timeindex``; temporary and swap suffixes are
appended after the normal one (``00000000000000000000.log.cleaned``).
"""

from __future__ import annotations

import glob
import re
import uuid
from pathlib import Path

from storage.errors import InvalidTopicNameError, LedgerviewError

LOG_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX)
TEMP_SUFFIX = ".tmp"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
DELETED_FOLDER_SUFFIX = "-delete"

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
TOPICS_FOLDER = "__topics"
TOPIC_METADATA = "topic.json"
TOPIC_DELETION_MARKER = "topic.json.deleting"
"""What a topic's metadata file is renamed to while the topic is deleted: its partition folders, which the deletion
removes after it, are to go too (a crash in between leaves them for the next open to remove)."""
STORE_LOCK = ".store.lock"
WRITER_LOCK = ".writer.lock"
REMOTE_LOCK = ".remote.lock"
"""Per partition: held while uploading to, or expiring from, the remote tier (one such worker per data folder)."""
REMOTE_EPOCH_RECORD = "remote-epoch.json"
"""Per partition: the epoch under which this data folder writes the partition's remote log."""
REMOTE_TIER_RECORD = "remote-tier.json"
"""In the data folder: the URI of its remote tier."""

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS = 100_000
"""Partitions a topic may have. Kafka sets no such bound, but each partition is a folder with its own files here,
so a mistyped count would create folders for hours: 100,000 took 9 s and 394 MB of metadata, checkpoints and
folders on this project's test machine."""
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_PARTITION_FOLDER = re.compile(r"(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>\d+)")
_SEGMENT_FILE = re.compile(r"(?P<base>\d{20})(?P<suffix>\.log|\.index|\.timeindex)(?P<temp>\.[a-z]+)?")


def validate_topic_name(name: str) -> str:
    """Return ``name`` if Kafka would accept it as a topic name, else raise InvalidTopicNameError."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicNameError(str(name), "it is empty or not a string")
    if name in (".", ".."):
        raise InvalidTopicNameError(name, "'.' and '..' are reserved")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicNameError(name, f"it is {len(name)} characters long")
    if not _TOPIC_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _TOPIC_NAME.fullmatch(c)})
        raise InvalidTopicNameError(name, f"it contains {''.join(bad)!r}")
    return name


def validate_partition_count(partitions: int) -> int:
    """Return ``partitions`` if a topic may have that many (1 to MAX_PARTITIONS), else raise LedgerviewError."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
        raise LedgerviewError(f"partitions must be an integer from 1 to {MAX_PARTITIONS:,}, got {partitions!r}.")
    return partitions


def partition_folder(root: Path, topic: str, partition: int) -> Path:
    return root / f"{validate_topic_name(topic)}-{partition}"


def parse_partition_folder(name: str) -> tuple[str, int] | None:
    """``prices-3`` -> ("prices", 3); None for anything that is not a live partition folder."""
    match = _PARTITION_FOLDER.fullmatch(name)
    return (match["topic"], int(match["partition"])) if match else None


def partitions_on_disk(root: Path, topic: str) -> list[int]:
    """The partitions of ``topic`` that have a folder in the data folder ``root``, for when its metadata record
    cannot say how many it has."""
    found = (parse_partition_folder(folder.name) for folder in root.glob(f"{glob.escape(topic)}-*"))
    return sorted(parsed[1] for parsed in found if parsed is not None and parsed[0] == topic)


def segment_file(folder: Path, base_offset: int, suffix: str) -> Path:
    return folder / f"{base_offset:020d}{suffix}"


def with_temporary_suffix(path: Path, temporary_suffix: str) -> Path:
    """A segment file's name with one of Kafka's temporary suffixes appended: ``….log`` -> ``….log.deleted``."""
    return path.with_name(path.name + temporary_suffix)


def parse_segment_file(name: str) -> tuple[int, str, str | None] | None:
    """``00000000000000000042.log.swap`` -> (42, ".log", ".swap"); None for other names."""
    match = _SEGMENT_FILE.fullmatch(name)
    if not match:
        return None
    return int(match["base"]), match["suffix"], match["temp"]


def topic_metadata_file(root: Path, topic: str) -> Path:
    """``__topics/<topic>/topic.json``: a folder per topic, so a 249-character name still leaves room for the
    temporary suffix of an atomic write."""
    return root / TOPICS_FOLDER / validate_topic_name(topic) / TOPIC_METADATA


def folder_to_delete(root: Path) -> Path:
    """A short unique name for a folder being deleted (a long topic name plus a suffix could pass 255 bytes)."""
    return root / f".{uuid.uuid4().hex}{DELETED_FOLDER_SUFFIX}"


LEDGERS_FOLDER = "compacted"
LEDGER_SUFFIX = ".ledger"
KEY_INDEX_SUFFIX = ".keys"
LAYER_RECORD_SUFFIX = ".layers"
COMPACTION_CURSOR = "cursor.json"
COMPACTION_STATUS = "status.json"
COMPACTION_LOCK = ".compaction.lock"
SUBSCRIPTIONS_FOLDER = "subscriptions"
SUBSCRIPTIONS_LOCK = ".subscriptions.lock"
_LEDGER_FILE = re.compile(r"(?P<id>\d{20})(?P<suffix>\.ledger|\.keys|\.layers)(?P<temp>\.[a-z]+)?")


def ledgers_folder(partition: Path) -> Path:
    """Where a partition's compacted ledgers, their key indexes and the compaction cursor live."""
    return partition / LEDGERS_FOLDER


def ledger_file(partition: Path, ledger_id: int) -> Path:
    return ledgers_folder(partition) / f"{ledger_id:020d}{LEDGER_SUFFIX}"


def key_index_folder(partition: Path, ledger_id: int) -> Path:
    return ledgers_folder(partition) / f"{ledger_id:020d}{KEY_INDEX_SUFFIX}"


def layer_record_file(partition: Path, ledger_id: int) -> Path:
    """The record naming the ledgers beneath ledger ``ledger_id`` when it tops a layered view
    (storage/ledger_layers.py)."""
    return ledgers_folder(partition) / f"{ledger_id:020d}{LAYER_RECORD_SUFFIX}"


def parse_ledger_file(name: str) -> tuple[int, str, str | None] | None:
    """``00000000000000000003.keys.deleted`` -> (3, ".keys", ".deleted"); None for other names."""
    match = _LEDGER_FILE.fullmatch(name)
    return (int(match["id"]), match["suffix"], match["temp"]) if match else None


def subscriptions_folder(partition: Path) -> Path:
    return partition / SUBSCRIPTIONS_FOLDER


SUBSCRIPTION_SUFFIX = ".json"


def subscription_file(partition: Path, subscription: str) -> Path:
    return subscriptions_folder(partition) / f"{validate_topic_name(subscription)}{SUBSCRIPTION_SUFFIX}"


def parse_subscription_file(name: str) -> str | None:
    """The subscription a file in a subscriptions folder holds, or None for any other file."""
    return name.removesuffix(SUBSCRIPTION_SUFFIX) if name.endswith(SUBSCRIPTION_SUFFIX) else None


SINKS_FOLDER = "__sinks"
SINK_RECORD = "sink.json"
SINK_STAGING_FOLDER = "staging"
SINK_PENDING_FOLDER = "pending"


def topic_sinks_folder(root: Path, topic: str) -> Path:
    """``__sinks/<topic>/``: a folder per sink writing into the topic."""
    return root / SINKS_FOLDER / validate_topic_name(topic)


def sink_folder(root: Path, topic: str, sink_id: str) -> Path:
    """``__sinks/<topic>/<sink id>/``: one writing sink's record of committed batches and its staged files."""
    return topic_sinks_folder(root, topic) / validate_topic_name(sink_id)


def staged_file_name(batch_id: int, task: int, attempt: int, unique: str) -> str:
    """A task's staged file for one batch; the batch id leads, zero-padded, so a prefix finds a batch's files."""
    return f"{staged_batch_prefix(batch_id)}p{task:05d}-a{attempt}-{unique}.arrow"


def staged_batch_prefix(batch_id: int) -> str:
    return f"b{batch_id:020d}-"


def parse_staged_batch(name: str) -> int | None:
    """The batch id of a staged file's name; None for other names."""
    match = re.fullmatch(r"b(\d{20})-.*\.arrow", name)
    return int(match[1]) if match else None
