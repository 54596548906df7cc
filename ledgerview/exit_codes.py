"""Exit statuses scripts can rely on, and the one place that maps an error to its status. The list below is what
``ledgerview --help`` prints; docs/cli.md's table says the same (tests/test_cli_bug_bash.py compares them).

    0  success
    1  a check failed: verify found damage, compaction-status saw ERROR, a command met corrupt stored data (a
       segment, ledger, key index, checkpoint or record file, or a lost compaction cursor)
    2  usage: a bad option, topic name, topic config or subscription name, a malformed input line, an offset or
       position out of range, a bad --remote, a bad service config, an address the service cannot listen on
    3  not found: unknown topic, partition, group or file
    4  conflict: the topic exists, a compaction is already running, a partition is locked, a service runs on the
       data folder, a retention hold, delete-records without cleanup.policy delete, another data folder holds the
       partition's remote log, or the local log no longer continues it, another compaction published first
    5  any other failure (I/O errors, a remote tier that is down, a partition that clean could not clean)
  130  interrupted (Ctrl-C)"""

from __future__ import annotations

import enum

from compactor import CompactionInProgressError
from ledgerview.errors import ListenError, MalformedInputError, ServiceConfigError, ServiceRunningError, UsageError
from readers.errors import InvalidPositionError
from readers.groups import InvalidResetError, UnknownGroupError
from storage.config import ConfigError
from storage.cursors import InvalidSubscriptionNameError
from storage.errors import (
    CorruptDataError,
    InvalidMessagesError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    PartitionLockedError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    WriterConflictError,
)
from storage.remote_log import RemoteSyncRefusal
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
    ((CorruptDataError,), ExitCode.CHECK_FAILED),
    ((UnknownTopicError, UnknownPartitionError, UnknownGroupError, FileNotFoundError), ExitCode.NOT_FOUND),
    ((TopicExistsError, CompactionInProgressError, PartitionLockedError, RetentionHoldError,
      RecordDeletionNotAllowedError, ServiceRunningError, RemoteSyncRefusal, WriterConflictError), ExitCode.CONFLICT),
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
