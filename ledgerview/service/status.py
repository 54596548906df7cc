"""What the service reports: per-partition status (offsets, sizes, horizon, dirty ratio, compaction and cleaner
state, last errors) as JSON, and the same figures as Prometheus text metrics."""

from __future__ import annotations

import os
import platform
import resource
import time
from collections.abc import Iterable
from dataclasses import asdict
from importlib.metadata import version
from typing import Any

from readers.groups import UnknownGroupError, describe_group, list_groups
from storage import Store
from storage.cleaner_manager import CleanerManager, first_dirty_offset, log_to_clean
from storage.compacted import CompactedLedgers
from storage.errors import LedgerviewError, UnknownTopicError
from storage.object_store import RemoteStorageError
from storage.partition_log import PartitionLog

PARTITION_FIGURES = ("start_offset", "end_offset", "size_bytes", "segments", "horizon", "compacted_messages",
                     "compacted_layers", "ledger_bytes", "dirty_bytes", "dirty_ratio", "compaction", "cleaner",
                     "next_retention_ms", "remote_upload_lag_bytes")
"""What a partition's status holds beside its number and last_errors; all null for a partition that cannot be
read."""


def partition_statuses(store: Store, topic: str, cleaner: CleanerManager | None) -> list[dict[str, Any]]:
    """Offsets, sizes, compaction horizon and backlog of each partition, with its last compaction run, for
    compact topics the in-place cleaner's view of it, and for tiered topics the upload lag.

    ``dirty_ratio`` is the share of the partition's bytes above the horizon, not yet in the compacted view (for a
    topic never compacted, all of it). The cleaner's ``dirty_ratio`` is Kafka's: cleanable bytes over clean plus
    cleanable bytes.

    A partition whose status cannot be read (damaged data, a lost cursor) is reported with its figures null and
    the error in ``last_errors``, and the other partitions as usual: the status must answer most when something
    is wrong."""
    statuses = []
    checkpoints: dict[tuple[str, int], int] = {}
    checkpoint_error = None
    try:
        checkpoints = cleaner.read_checkpoints() if cleaner else {}
    except LedgerviewError as error:  # the cleaner's state is unknown; the rest of each partition is not
        checkpoint_error = f"cleaner: {type(error).__name__}: {error}"
    uncleanable = cleaner.uncleanable() if cleaner else {}
    for partition in range(store.topic_metadata(topic).partitions):
        key = (topic, partition)
        try:
            statuses.append(_partition_status(store, topic, partition, cleaner, checkpoints.get(key),
                                              uncleanable.get(key), checkpoint_error))
        except UnknownTopicError:
            raise
        except LedgerviewError as error:
            statuses.append({"partition": partition, **dict.fromkeys(PARTITION_FIGURES),
                             "last_errors": [f"{type(error).__name__}: {error}"]})
    return statuses


def _partition_status(store: Store, topic: str, partition: int, cleaner: CleanerManager | None,
                      checkpoint: int | None, uncleanable: str | None, checkpoint_error: str | None) -> (
    dict[str, Any]
):
    """``checkpoint_error``: why the cleaner's checkpoint cannot be read, which a compact partition shows in its
    ``last_errors`` instead of its cleaner status."""
    log = store.partition_log(topic, partition)
    log.refresh()
    compaction = CompactedLedgers(log.folder).status(partition)
    cursor = store.compacted_ledgers(topic, partition).read_cursor()
    horizon = cursor.horizon if cursor else -1
    errors = [compaction.last_error] if compaction.last_error else []
    size, dirty = _sizes(log, horizon, errors)
    if uncleanable is not None:
        errors.append(f"cleaner: {uncleanable}")
    cleaner_known = checkpoint_error is None or cleaner is None or not log.config.is_compact
    if not cleaner_known:
        errors.append(str(checkpoint_error))
    return {
        "partition": partition,
        "start_offset": log.log_start_offset,
        "end_offset": log.end_offset,
        "size_bytes": size,
        "segments": len(log.segments),
        "horizon": horizon,
        "compacted_messages": cursor.messages_kept if cursor else 0,
        "compacted_layers": len(cursor.ledger_ids) if cursor else 0,
        "ledger_bytes": cursor.ledger_bytes if cursor else 0,
        "dirty_bytes": dirty,
        "dirty_ratio": round(dirty / size, 6) if size else 0.0,
        "compaction": compaction.as_record(),
        "cleaner": _cleaner_status(store, log, cleaner, checkpoint, uncleanable) if cleaner_known else None,
        "next_retention_ms": _next_retention_ms(log),
        "remote_upload_lag_bytes": _upload_lag_bytes(store, log),
        "last_errors": errors,
    }


def _sizes(log: PartitionLog, horizon: int, errors: list[str]) -> tuple[int, int]:
    """The partition's bytes and those above the horizon. A tiered partition's count its remote segments, whose
    list is read from the remote tier after a local change; while that cannot be read, the local bytes alone (a
    lower bound), and why in ``errors``: the status must answer most when the remote tier is down."""
    try:
        return log.size_bytes, (log.bytes_above(horizon) if log.end_offset > max(horizon + 1, log.log_start_offset)
                                else 0)
    except RemoteStorageError as error:
        errors.append(f"{error} Sizes count local segments only.")
        local_above = max(horizon, log.segments[0].base_offset - 1)
        return log.local_size_bytes, log.bytes_above(local_above) if log.end_offset > local_above + 1 else 0


def _next_retention_ms(log: PartitionLog) -> int | None:
    """When retention.ms next deletes a segment: the oldest sealed one's newest timestamp plus retention.ms
    (None: time retention is off, the topic keeps nothing by delete, or no segment is sealed yet)."""
    if not log.config.is_delete or log.config.retention_ms < 0 or len(log.segments) < 2:
        return None
    return int(log.segments[0].max_timestamp) + log.config.retention_ms


def _upload_lag_bytes(store: Store, log: PartitionLog) -> int | None:
    """Bytes of the partition's sealed segments not yet on the remote tier, as of the last manifest the service's
    upload loop saw (``Store.remote_upload_lag``); None when the topic is not tiered, or when no manifest was seen
    yet and the remote tier cannot be read."""
    try:
        return store.remote_upload_lag(log.topic, log.partition)
    except RemoteStorageError:
        return None


def _cleaner_status(store: Store, log: PartitionLog, cleaner: CleanerManager | None, checkpoint: int | None,
                    uncleanable: str | None) -> dict[str, Any] | None:
    """None when the topic is not compact or the service runs no cleaner."""
    if cleaner is None or not log.config.is_compact:
        return None
    first_dirty, _ = first_dirty_offset(log, checkpoint)
    to_clean = log_to_clean(log, first_dirty, hold=store.retention_hold(log.topic, log.partition),
                            now_ms=store.clock())
    return {"state": cleaner.state((log.topic, log.partition)).value, "first_dirty_offset": first_dirty,
            "first_uncleanable_offset": to_clean.first_uncleanable_offset, "clean_bytes": to_clean.clean_bytes,
            "cleanable_bytes": to_clean.cleanable_bytes, "dirty_ratio": round(to_clean.dirty_ratio, 6),
            "uncleanable": uncleanable}


def service_status(store: Store, *, started_ms: int, now_ms: int, sources: list[dict[str, Any]],
                   loops: dict[str, Any], topic_errors: dict[str, list[str]], cleaner: CleanerManager | None) -> (
    dict[str, Any]
):
    """``topic_errors``: the last failures of loops and sources per topic, shown with the topic. A topic whose
    metadata cannot be read has no partitions and the error in its ``last_errors``."""
    topics = []
    for topic in store.list_topics():
        errors = topic_errors.get(topic, [])
        try:
            config = dict(store.topic_metadata(topic).overrides)
            partitions = partition_statuses(store, topic, cleaner)
        except UnknownTopicError:  # deleted meanwhile
            continue
        except LedgerviewError as error:  # its metadata cannot be read: named, and the other topics reported
            config, partitions, errors = {}, [], [*errors, f"{type(error).__name__}: {error}"]
        topics.append({"topic": topic, "partitions": partitions, "config": config, "last_errors": errors})
    failed = [source["name"] for source in sources if source["state"] == "failed"]
    return {
        "status": "degraded" if failed else "ok",
        "failed_sources": failed,
        "data": str(store.root.resolve()),
        "started_ms": started_ms,
        "uptime_s": round((now_ms - started_ms) / 1000, 3),
        "sources": sources,
        "loops": loops,
        "topics": topics,
        **_groups(store),
    }


def _groups(store: Store) -> dict[str, Any]:
    """``groups``: each group or subscription with its positions (``error`` when they cannot be read; a group
    removed meanwhile is left out); ``groups_error``: why there are none when they cannot be listed (a partition
    that does not open), else None."""
    try:
        names = list_groups(store)
    except LedgerviewError as error:
        return {"groups": [], "groups_error": f"{type(error).__name__}: {error}"}
    groups: list[dict[str, Any]] = []
    for group in names:
        try:
            positions = [asdict(position) | {"lag": position.lag} for position in describe_group(store, group)]
        except UnknownGroupError:
            continue
        except LedgerviewError as error:
            groups.append({"group": group, "positions": [], "error": f"{type(error).__name__}: {error}"})
        else:
            groups.append({"group": group, "positions": positions, "error": None})
    return {"groups": groups, "groups_error": None}


PROCESS_START_S = round(time.time(), 3)
"""When this module was imported: the service's start, to the precision a dashboard needs."""
COMPACTION_STATES = ("NOT_RUN", "RUNNING", "SUCCESS", "ERROR")
_PARTITION_GAUGES = (
    ("start_offset", "ledgerview_partition_start_offset", "The partition's log start offset."),
    ("end_offset", "ledgerview_partition_end_offset", "The offset the next appended message gets."),
    ("size_bytes", "ledgerview_partition_size_bytes", "Bytes of the partition's raw segments."),
    ("segments", "ledgerview_partition_segments", "Number of raw segments."),
    ("horizon", "ledgerview_partition_compaction_horizon", "Last offset the compacted view covers (-1: none)."),
    ("compacted_messages", "ledgerview_partition_compacted_messages", "Messages the compacted view serves."),
    ("compacted_layers", "ledgerview_partition_compacted_layers",
     "Ledgers the compacted view reads (more than 1: a layered view)."),
    ("ledger_bytes", "ledgerview_partition_ledger_bytes", "Bytes of the compacted view's ledgers."),
    ("dirty_bytes", "ledgerview_partition_dirty_bytes", "Raw bytes above the compaction horizon."),
    ("dirty_ratio", "ledgerview_partition_dirty_ratio", "Share of raw bytes above the compaction horizon."),
)
_CLEANER_GAUGES = (
    ("first_dirty_offset", "ledgerview_partition_cleaner_first_dirty_offset",
     "First offset the in-place cleaner has not cleaned yet (compact topics)."),
    ("cleanable_bytes", "ledgerview_partition_cleaner_cleanable_bytes", "Bytes the in-place cleaner may clean now."),
    ("dirty_ratio", "ledgerview_partition_cleaner_dirty_ratio",
     "Cleanable bytes over clean plus cleanable bytes (Kafka's dirty ratio)."),
)
_SOURCE_COUNTERS = (
    ("messages", "ledgerview_source_messages_total", "Messages the source appended since the service started."),
    ("appends", "ledgerview_source_appends_total", "Appends the source made since the service started."),
    ("errors", "ledgerview_source_errors_total", "Failures of the source since the service started."),
)
_LOOP_COUNTERS = (
    ("runs", "ledgerview_loop_runs_total", "Passes of the service loop since the service started."),
    ("errors", "ledgerview_loop_errors_total", "Failed passes of the service loop since the service started."),
)


def prometheus_text(status: dict[str, Any]) -> str:
    """The status as Prometheus text exposition format (version 0.0.4)."""
    lines = ["# HELP ledgerview_up 1 while the service runs.", "# TYPE ledgerview_up gauge", "ledgerview_up 1",
             "# HELP ledgerview_uptime_seconds Seconds since the service started.",
             "# TYPE ledgerview_uptime_seconds gauge", f"ledgerview_uptime_seconds {status['uptime_s']}"]
    partitions = [({"topic": topic["topic"], "partition": str(p["partition"])}, p)
                  for topic in status["topics"] for p in topic["partitions"]
                  if p["end_offset"] is not None]  # an unreadable partition has no figures
    for key, name, help_text in _PARTITION_GAUGES:
        lines += _family(name, "gauge", help_text, ((labels, p[key]) for labels, p in partitions))
    lines += _family("ledgerview_partition_compaction_state", "gauge",
                     "1 for the state of the partition's last compaction run, 0 for the others.",
                     (({**labels, "state": state}, int(p["compaction"]["state"] == state))
                      for labels, p in partitions for state in COMPACTION_STATES))
    lines += _family("ledgerview_remote_upload_lag_bytes", "gauge",
                     "Bytes of sealed segments not yet uploaded to the remote tier (tiered partitions).",
                     ((labels, p["remote_upload_lag_bytes"]) for labels, p in partitions
                      if p["remote_upload_lag_bytes"] is not None))
    cleaned = [(labels, p["cleaner"]) for labels, p in partitions if p["cleaner"] is not None]
    for key, name, help_text in _CLEANER_GAUGES:
        lines += _family(name, "gauge", help_text, ((labels, cleaner[key]) for labels, cleaner in cleaned))
    sources = [({"source": s["name"], "topic": s["topic"]}, s) for s in status["sources"]]
    for key, name, help_text in _SOURCE_COUNTERS:
        lines += _family(name, "counter", help_text, ((labels, s[key]) for labels, s in sources))
    loops = [({"loop": name}, stats) for name, stats in status["loops"].items()]
    for key, name, help_text in _LOOP_COUNTERS:
        lines += _family(name, "counter", help_text, ((labels, stats[key]) for labels, stats in loops))
    lines += _family("ledgerview_partition_compaction_last_success_timestamp_seconds", "gauge",
                     "When the partition's last successful compaction ended.",
                     ((labels, p["compaction"]["ended_ms"] / 1000) for labels, p in partitions
                      if p["compaction"]["state"] == "SUCCESS" and p["compaction"]["ended_ms"] is not None))
    counters = status.get("compaction_counters")
    if counters is not None:
        for key, name, help_text in _COMPACTION_COUNTERS:
            lines += _family(name, "counter", help_text, [({}, counters[key])])
    positions = [({"group": group["group"], "topic": p["topic"], "partition": str(p["partition"])}, p)
                 for group in status["groups"] for p in group["positions"]
                 if p["lag"] is not None]  # on an unreadable partition: not a number Prometheus would take
    lines += _family("ledgerview_group_lag", "gauge", "End offset minus the group's committed offset.",
                     ((labels, p["lag"]) for labels, p in positions))
    lines += process_metrics()
    return "\n".join(lines) + "\n"


_COMPACTION_COUNTERS = (
    ("runs", "ledgerview_compaction_runs_total", "Compactions the service ran (skipped ones included)."),
    ("skipped", "ledgerview_compaction_skipped_total", "Compactions that found nothing new above the horizon."),
    ("messages_read", "ledgerview_compaction_messages_read_total", "Messages compactions read."),
    ("messages_kept", "ledgerview_compaction_messages_kept_total", "Messages compactions wrote to ledgers."),
    ("seconds", "ledgerview_compaction_seconds_total", "Seconds the compaction loop spent compacting."),
)


def process_metrics() -> list[str]:
    """Prometheus's standard process metrics, and build info."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    lines = _family("process_cpu_seconds_total", "counter", "User and system CPU seconds.",
                    [({}, round(usage.ru_utime + usage.ru_stime, 3))])
    lines += _family("process_resident_memory_bytes", "gauge", "Resident memory in bytes.",
                     [({}, resident_pages * os.sysconf("SC_PAGE_SIZE"))])
    lines += _family("process_open_fds", "gauge", "Open file descriptors.", [({}, len(os.listdir("/proc/self/fd")))])
    lines += _family("process_start_time_seconds", "gauge", "Start time of the process, seconds since the epoch.",
                     [({}, PROCESS_START_S)])
    lines += _family("ledgerview_build_info", "gauge", "1, labelled with the running version.",
                     [({"version": version("ledgerview"), "python": platform.python_version()}, 1)])
    return lines


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], object]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        rendered = ",".join(f'{key}="{_escape(label)}"' for key, label in labels.items())
        lines.append(f"{name}{{{rendered}}} {value}")
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def stats_record(stats: object) -> dict[str, Any]:
    return asdict(stats)  # type: ignore[call-overload, no-any-return]
