"""Compaction status per partition, in Pulsar's states, stored beside the compaction cursor so that every process
sees the same answer (the compactor writes it; `verify` reads it to tell a lost cursor from a first run that
never published)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from storage.fileio import write_atomically
from storage.files import COMPACTION_STATUS, ledgers_folder
from storage.records import CorruptRecordError, decode_record, encode_record, is_count

STATUS_RECORD = "compaction-status"
STATUS_VERSION = 2
"""1: the bare record of earlier releases (still read); 2: storage/records.py's format."""


class CompactionState(enum.Enum):
    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


@dataclass(frozen=True)
class CompactionStatus:
    """The last compaction run of one partition."""

    partition: int
    state: CompactionState = CompactionState.NOT_RUN
    last_error: str | None = None
    started_ms: int | None = None
    ended_ms: int | None = None
    messages_read: int = 0
    messages_kept: int = 0
    messages_removed: int = 0
    published_ledger_id: int | None = None
    """The top ledger of the last view a run published here, kept by the statuses of the runs after it (failed or
    still running too): with it a lost compaction cursor is told from a partition never compacted."""

    def __post_init__(self) -> None:
        _check(is_count(self.partition), f"partition {self.partition!r} is not an integer >= 0")
        _check(isinstance(self.state, CompactionState), f"state {self.state!r} is not a CompactionState")
        _check(self.last_error is None or isinstance(self.last_error, str),
               f"last_error {self.last_error!r} is not None or text")
        for name in ("started_ms", "ended_ms", "published_ledger_id"):
            value = getattr(self, name)
            _check(value is None or is_count(value), f"{name} {value!r} is not None or an integer >= 0")
        for name in ("messages_read", "messages_kept", "messages_removed"):
            value = getattr(self, name)
            _check(is_count(value), f"{name} {value!r} is not an integer >= 0")

    def as_record(self) -> dict[str, object]:
        return {**asdict(self), "state": self.state.value}


def status_path(partition_folder: Path) -> Path:
    return ledgers_folder(partition_folder) / COMPACTION_STATUS


def read_status(partition_folder: Path, partition: int, *, run_in_progress: Callable[[], bool]) -> CompactionStatus:
    """The stored status; a RUNNING status whose run holds no lock any more is reported as an ERROR."""
    record = _stored_record(partition_folder)
    if record is None:
        return CompactionStatus(partition)
    try:
        status = CompactionStatus(**{**record, "state": CompactionState(record["state"])})
    except (ValueError, TypeError, KeyError) as error:
        raise CorruptRecordError(str(status_path(partition_folder)), STATUS_RECORD, str(error)) from None
    if status.state is CompactionState.RUNNING and not run_in_progress():
        return replace(status, state=CompactionState.ERROR,
                       last_error="the process running this compaction stopped before it finished")
    return status


def published_a_view(partition_folder: Path) -> bool:
    """Whether a run published a view here (its compaction cursor is written before the status that says so). A
    status of an earlier release says it only while its run succeeded. False without a status or with one that
    cannot be read."""
    try:
        record = _stored_record(partition_folder)
    except CorruptRecordError:
        return False
    return record is not None and (record.get("published_ledger_id") is not None
                                   or record.get("state") == CompactionState.SUCCESS.value)


def _stored_record(partition_folder: Path) -> dict[str, Any] | None:
    """The status record's body; None when there is none."""
    path = status_path(partition_folder)
    try:
        return decode_record(path, path.read_bytes(), STATUS_RECORD, max_version=STATUS_VERSION, legacy=True)[1]
    except FileNotFoundError:
        return None


def _check(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(problem)


def write_status(partition_folder: Path, status: CompactionStatus) -> None:
    ledgers_folder(partition_folder).mkdir(exist_ok=True)
    write_atomically(status_path(partition_folder), encode_record(STATUS_RECORD, STATUS_VERSION, status.as_record()))
