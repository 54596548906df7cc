"""Exit statuses scripts can rely on, and the one place that maps an error to its status.

    0  success
    1  a check failed: verify found damage, a command met a corrupt file or record, compaction-status saw ERROR
    2  usage: bad option, bad topic config, malformed input, an offset or position out of range, a bad --remote
    3  not found: unknown topic, partition or file
    4  conflict: the topic exists, a compaction is already running, a partition is locked, a service runs,
       another data folder holds the partition's remote log
    5  any other failure (I/O errors and a remote tier that is down included)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import enum

from compactor import CompactionInProgressError
from ledgerview.errors import ListenError, MalformedInputError, ServiceConfigError, ServiceRunningError, UsageError
from readers.errors import InvalidPositionError
from readers.groups import InvalidResetError, UnknownGroupError
from storage.config import ConfigError
from storage.cursors import InvalidSubscriptionNameError
from storage.errors import (
    CorruptSegmentError,
    InvalidMessagesError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    PartitionLockedError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from storage.records import CorruptRecordError
from storage.remote_log import RemoteLogFencedError
from storage.retention import (
    DeleteRecordsOutOfRangeError,
    RecordDeletionNotAllowedError,
    RetentionHoldError,
)


class ExitCode(enum.IntEnum):
    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    FAILED = 5
    INTERRUPTED = 130


_BY_ERROR: tuple[tuple[tuple[type[BaseException], ...], ExitCode], ...] = (
    ((CorruptSegmentError, CorruptRecordError), ExitCode.CHECK_FAILED),
    ((UnknownTopicError, UnknownPartitionError, UnknownGroupError, FileNotFoundError), ExitCode.NOT_FOUND),
    ((TopicExistsError, CompactionInProgressError, PartitionLockedError, RetentionHoldError,
      RecordDeletionNotAllowedError, ServiceRunningError, RemoteLogFencedError), ExitCode.CONFLICT),
    ((UsageError, ConfigError, MalformedInputError, InvalidMessagesError, InvalidTopicNameError,
      InvalidSubscriptionNameError, InvalidPositionError, OffsetOutOfRangeError, DeleteRecordsOutOfRangeError,
      ServiceConfigError, InvalidResetError, ListenError), ExitCode.USAGE),
)


def exit_code_for(error: BaseException) -> ExitCode:
    for kinds, code in _BY_ERROR:
        if isinstance(error, kinds):
            return code
    return ExitCode.FAILED


EXIT_CODES_HELP = __doc__.split("\n\n", 1)[1].rstrip() if __doc__ else ""
