"""Subscription cursor records: the durable position of one subscription on one partition.

One JSON file per (partition, subscription) at ``storage.files.subscription_file``, replaced atomically
(write, fsync, rename, fsync the folder) on every cumulative acknowledgement, so a crash leaves the old position
or the new one. The position is Kafka's committed-offset convention: the next offset to read. Acknowledgements
never move it back; that rule is applied by the writer (readers/consumer.py) against the stored record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from storage.errors import CorruptDataError, InvalidTopicNameError, LedgerviewError
from storage.fileio import fsync_folder, holds_temporary_files, remove_stray_temporary_files, write_atomically
from storage.files import (
    MAX_TOPIC_NAME_LENGTH,
    SUBSCRIPTIONS_LOCK,
    TEMP_SUFFIX,
    parse_subscription_file,
    subscription_file,
    subscriptions_folder,
    validate_topic_name,
)
from storage.locks import FileLock
from storage.records import CorruptRecordError, decode_record, encode_record

CURSOR_RECORD = "subscription-cursor"
CURSOR_VERSION = 2
"""1: the unchecksummed record of earlier releases (still read); 2: storage/records.py's format."""
FILE_NAME_BYTES_MAX = 255
_FILE_NAME_EXTRA = len(subscription_file(Path(), "s").name) - 1 + len(TEMP_SUFFIX)
MAX_SUBSCRIPTION_NAME_LENGTH = min(MAX_TOPIC_NAME_LENGTH, FILE_NAME_BYTES_MAX - _FILE_NAME_EXTRA)
"""Topic-name rules, but short enough that ``<name>.json.tmp`` (the atomic write's temporary) fits a file name."""


class InvalidSubscriptionNameError(LedgerviewError):
    def __init__(self, name: object, reason: str) -> None:
        self.name = name
        super().__init__(
            f"Invalid subscription name {name!r}: {reason}. A subscription name follows the topic-name rules: "
            f"1 to {MAX_SUBSCRIPTION_NAME_LENGTH} characters from [a-zA-Z0-9._-], not '.' or '..'."
        )


class CorruptSubscriptionCursorError(CorruptDataError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(
            f"Subscription cursor {path} is unreadable: {reason}. Remove it to restart the subscription from its "
            "initial position."
        )


def validate_subscription_name(name: object) -> str:
    """Return ``name`` if it is a valid subscription name, else raise InvalidSubscriptionNameError."""
    if not isinstance(name, str):
        raise InvalidSubscriptionNameError(name, "it is not a string")
    try:
        validate_topic_name(name)
    except InvalidTopicNameError as error:
        raise InvalidSubscriptionNameError(name, "it breaks the topic-name rules") from error
    if len(name) > MAX_SUBSCRIPTION_NAME_LENGTH:
        raise InvalidSubscriptionNameError(name, f"it is {len(name)} characters long")
    return name


@dataclass(frozen=True)
class SubscriptionCursor:
    """Where one subscription stands on one partition."""

    subscription: str
    """The subscription's name (topic-name rules)."""
    partition: int
    """The partition this position belongs to."""
    acked_offset: int
    """The next offset to read: every message of the subscription's view below it is acknowledged. It may point
    below the raw log start when the acknowledged messages exist only in the compacted ledger."""
    read_compacted: bool
    """Whether the position was acknowledged on the compacted view (informational; a consumer may switch views)."""
    ledger_id: int | None
    """The compacted ledger the acknowledged messages were read from; None for the raw log. A compacted consumer
    that reopens continues on that ledger if it is still current, and on the raw log otherwise, so tombstones
    published by a newer compaction are not skipped."""
    updated_ms: int
    """Wall-clock time of the acknowledgement that wrote this record."""
    metadata: str = ""
    """What a Kafka client committed with the offset (its OffsetCommit metadata), handed back by OffsetFetch."""

    def __post_init__(self) -> None:
        validate_subscription_name(self.subscription)
        _check(isinstance(self.partition, int) and self.partition >= 0, f"partition {self.partition!r} < 0")
        _check(isinstance(self.acked_offset, int) and self.acked_offset >= 0,
               f"acked_offset {self.acked_offset!r} < 0")
        _check(isinstance(self.read_compacted, bool), f"read_compacted {self.read_compacted!r} is not a bool")
        _check(self.ledger_id is None or (isinstance(self.ledger_id, int) and self.ledger_id >= 0),
               f"ledger_id {self.ledger_id!r} is not None or an id >= 0")
        _check(isinstance(self.metadata, str), f"metadata {self.metadata!r} is not a string")

    def encode(self) -> bytes:
        return encode_record(CURSOR_RECORD, CURSOR_VERSION, asdict(self))

    @classmethod
    def decode(cls, path: Path, data: bytes) -> SubscriptionCursor:
        try:
            _, record = decode_record(path, data, CURSOR_RECORD, max_version=CURSOR_VERSION, legacy=True)
            return cls(**record)
        except CorruptRecordError as error:
            raise CorruptSubscriptionCursorError(path, error.reason) from error
        except (ValueError, TypeError, KeyError, LedgerviewError) as error:
            raise CorruptSubscriptionCursorError(path, str(error)) from error


def _check(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(problem)


def read_subscription_cursor(partition_folder: Path, subscription: str, partition: int) -> SubscriptionCursor | None:
    """The stored record, or None when the subscription has no position on this partition yet."""
    path = subscription_file(partition_folder, validate_subscription_name(subscription))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    cursor = SubscriptionCursor.decode(path, data)
    if (cursor.subscription, cursor.partition) != (subscription, partition):
        raise CorruptSubscriptionCursorError(
            path, f"it holds {cursor.subscription!r} partition {cursor.partition}, not {subscription!r} {partition}")
    return cursor


def write_subscription_cursor(partition_folder: Path, cursor: SubscriptionCursor) -> None:
    """Replace the record atomically, holding the folder's lock so that a sweep of stray temporaries
    (``remove_stray_cursor_temporaries``) never takes this write's; the first write also creates (and makes
    durable) the subscriptions folder."""
    path = subscription_file(partition_folder, cursor.subscription)
    if not path.parent.exists():
        path.parent.mkdir(exist_ok=True)
        fsync_folder(path.parent.parent)
    with FileLock(path.parent / SUBSCRIPTIONS_LOCK):
        write_atomically(path, cursor.encode())


def subscription_names(partition_folder: Path) -> list[str]:
    """The subscriptions with a position on this partition, sorted."""
    try:
        names = [entry.name for entry in subscriptions_folder(partition_folder).iterdir()]
    except FileNotFoundError:
        return []
    return sorted(name for entry in names if (name := parse_subscription_file(entry)) is not None)


def remove_subscription_cursor(partition_folder: Path, subscription: str) -> bool:
    """Forget the subscription's position on this partition (durably); whether there was one."""
    path = subscription_file(partition_folder, validate_subscription_name(subscription))
    if not path.exists():
        return False
    with FileLock(path.parent / SUBSCRIPTIONS_LOCK):
        path.unlink(missing_ok=True)
        fsync_folder(path.parent)
    return True


def remove_stray_cursor_temporaries(partition_folder: Path) -> list[Path]:
    """Remove the temporaries of cursor writes a crash interrupted; returns what was removed. Under the folder's
    lock, taken only when there is something to remove, so a write in progress keeps its temporary."""
    folder = subscriptions_folder(partition_folder)
    if not holds_temporary_files(folder):
        return []
    with FileLock(folder / SUBSCRIPTIONS_LOCK):
        return remove_stray_temporary_files(folder)
