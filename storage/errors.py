"""Every error ledgerview raises on purpose.

One root, one class per condition; each message is built from the fields and says what went wrong, where, what
is allowed and what to do (tests/test_error_root.py lists the few internal exceptions outside the root and where
each is converted). An ``OSError`` of the file system (a full disk, a folder that cannot be written) passes as it
is, naming its file; the CLI prints it as one line (the reason and the file), never a traceback.
"""

from __future__ import annotations


class LedgerviewError(Exception):
    """Root of every error ledgerview raises on purpose."""


class CorruptDataError(LedgerviewError):
    """Stored bytes that fail their checks (a segment, ledger, index or record file): what a check found, which the
    command line reports with its "check failed" status."""


class RemoteTierMismatchError(LedgerviewError):
    def __init__(self, folder: str, known: str, given: str) -> None:
        self.known, self.given = known, given
        super().__init__(f"The data folder {folder} is tiered to {known}, not {given}: its remote segments are "
                         f"there. Open it without a remote URI, or with {known}.")


class NoRemoteTierError(LedgerviewError):
    def __init__(self, folder: str) -> None:
        super().__init__(f"The store at {folder} has no remote tier; open it with "
                         "Store.open(path, remote='s3://bucket/prefix') (or --remote) first.")


class TopicNotTieredError(LedgerviewError):
    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"Topic {topic!r} has remote.storage.enable=false: nothing of it is on the remote tier. "
                         "Set it to true (ledgerview topics alter) to tier it.")


class InvalidTopicNameError(LedgerviewError):
    """A topic name that Kafka would refuse or that would leave the data folder."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(
            f"Invalid topic name {name!r}: {reason}. A topic name is 1 to 249 characters from [a-zA-Z0-9._-] "
            "and is not '.' or '..'."
        )


class TopicExistsError(LedgerviewError):
    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"Topic {topic!r} already exists; delete it first or choose another name.")


class OrphanPartitionFolderError(TopicExistsError):
    """A topic would be created over a partition folder that holds data but belongs to no topic (its metadata file
    went missing): creating it would delete those messages."""

    def __init__(self, topic: str, folder: str, topic_folder: str) -> None:
        self.topic = topic
        LedgerviewError.__init__(
            self, f"Cannot create topic {topic!r}: {folder} holds data but no topic (no topic.json in "
                  f"{topic_folder}), and creating the topic would delete it. Restore that topic.json to serve the "
                  "topic again, or move the folder out of the data folder first. Nothing was created.")


class UnknownTopicError(LedgerviewError):
    def __init__(self, topic: str, known: list[str]) -> None:
        self.topic = topic
        listing = ", ".join(known) if known else "none"
        super().__init__(f"Unknown topic {topic!r}. Topics in this store: {listing}.")


class TopicDeletedError(UnknownTopicError):
    """The topic went (deleted by another process) while this one was appending to it."""

    def __init__(self, topic: str, known: list[str]) -> None:
        self.topic = topic
        LedgerviewError.__init__(self, f"Topic {topic!r} was deleted (by another process) while this one was "
                                       f"appending to it. Topics in this store: {', '.join(known) or 'none'}.")


class UnknownPartitionError(LedgerviewError):
    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        self.topic, self.partition = topic, partition
        super().__init__(
            f"Topic {topic!r} has no partition {partition}; its partitions are 0 to {partitions - 1}."
        )


class InvalidMessagesError(LedgerviewError):
    """Input to append that is not a valid set of messages; nothing was written."""


class MessageTooLargeError(InvalidMessagesError):
    def __init__(self, topic: str, row: int, size_bytes: int, limit_bytes: int) -> None:
        self.row, self.size_bytes, self.limit_bytes = row, size_bytes, limit_bytes
        super().__init__(
            f"Message at row {row} is {size_bytes} bytes, over max.message.bytes={limit_bytes} of topic "
            f"{topic!r}; nothing was written. Raise max.message.bytes or split the value."
        )


class KeylessMessageError(InvalidMessagesError):
    def __init__(self, topic: str, row: int) -> None:
        self.row = row
        super().__init__(
            f"Message at row {row} has no key, and topic {topic!r} is compacted (cleanup.policy=compact), which "
            "keeps the latest value per key: a message without a key could never be read back after cleaning. "
            "Nothing was written. Give every message a key, or set cleanup.policy=compact,delete."
        )


class OffsetOutOfRangeError(LedgerviewError):
    def __init__(self, topic: str, partition: int, offset: int, start: int, end: int) -> None:
        self.offset, self.start, self.end = offset, start, end
        super().__init__(
            f"Offset {offset} is outside {topic}-{partition}, which holds offsets {start} to {end} "
            "(end exclusive)."
        )


class SegmentDeletedError(LedgerviewError, FileNotFoundError):
    """A segment a read in progress had planned on, removed (by retention or cleaning) before the read reached it:
    its messages are no longer in the log. Still a FileNotFoundError, which the callers that list the segments
    again (storage/loader.py) and the append's check for a deleted topic catch."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"The segment {path} was deleted while this read was in progress (retention or cleaning "
                         "removed it, and file.delete.delay.ms had passed): its messages are no longer in the log. "
                         "Read again from the log start; a longer file.delete.delay.ms keeps deleted segments "
                         "readable for reads in progress.")


class CorruptSegmentError(CorruptDataError):
    """A batch of a segment whose bytes do not verify (its CRC, or a header that does not parse where no write can
    be under way: a sealed segment, or below the recovery point): data would be silently lost if it were skipped
    or cut."""

    def __init__(self, path: str, position: int, offset: int, reason: str) -> None:
        self.path, self.position, self.offset = path, position, offset
        super().__init__(
            f"Corrupt batch in {path} at file position {position}, where offset {offset} was expected: {reason}. "
            "Nothing was skipped or cut: restore the segment from a copy, or remove it and the segments after it."
        )


class CorruptLedgerError(CorruptSegmentError):
    """A batch of a compacted ledger whose bytes do not verify: the compacted view cannot be served past it."""

    repair = ("Rebuild the compacted view from the raw log with `ledgerview verify --repair`, which works while "
              "retention has not removed the raw messages the ledger covers.")

    def __init__(self, path: str, position: int, offset: int, reason: str) -> None:
        self.path, self.position, self.offset = path, position, offset
        first = f" (its messages from offset {offset})" if offset >= 0 else ""
        LedgerviewError.__init__(self, (
            f"Corrupt batch in compacted ledger {path} at file position {position}{first}: {reason}. {self.repair}"))


class CorruptRemoteLedgerError(CorruptLedgerError):
    """A batch of a compacted ledger on the remote tier whose bytes do not verify; `verify --repair` rebuilds local
    views only."""

    repair = ("Compact the topic again (from the data folder that owns its remote log, or with compact --spark for "
              "a tier no data folder owns), which uploads a new view; the raw log on the tier is intact.")


class PartitionLockedError(LedgerviewError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"Another writer holds the lock {path}. Wait for it (open the store with lock_wait=True) or stop "
            "the other process."
        )


class WriterConflictError(LedgerviewError):
    """Another writer's claim or work stands in the way of this one: the command line's exit status 4
    (conflict). What the error names was left as that writer made it."""


class ReadOnlyStoreError(LedgerviewError):
    def __init__(self, path: str) -> None:
        super().__init__(f"This store was opened read-only (Store.open(..., read_only=True), as Spark's read tasks "
                         f"open it), so it changes nothing: refused to take {path}. Open it without read_only to "
                         "write.")


class StoreClosedError(LedgerviewError):
    def __init__(self) -> None:
        super().__init__("The store is closed; open it again with Store.open(path).")
