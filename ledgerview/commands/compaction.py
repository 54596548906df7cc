"""``ledgerview compact`` and ``compaction-status``: Pulsar's ``topics compact`` and ``topics compaction-status``."""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Sequence

from compactor import CompactionResult, CompactionState, Compactor
from ledgerview.commands.common import (
    Subparsers,
    add_command,
    check_remote_uri,
    open_existing_store,
    open_store_for_reading,
    print_json,
    print_table,
    require_topic,
    say,
)
from ledgerview.errors import UsageError
from ledgerview.exit_codes import ExitCode
from ledgerview.progress import progress
from storage import Store
from storage.object_store import RemoteStorageError

COMPACT_DESCRIPTION = """Run two-phase compaction of a topic now, partition by partition, and wait for it.

Each partition's compacted view becomes a new ledger holding the latest live message of every key up to the
horizon (the end offset when the run started); raw segments are never changed. A partition compacting in another
process makes this command fail with exit status 4.

With --spark MASTER the topic of the remote tier --remote names is compacted as a Spark job on MASTER (a cluster
or local[N]): executors read the tier and write the new ledger there in pieces, the driver publishes it; no data
folder is used. This compacts remote logs that no data folder owns (those a Spark sink with an object-store path
writes); a folder's tiered topics are compacted where the folder is.

examples:
  ledgerview compact prices
  ledgerview compact prices --spark spark://head:7077 --remote s3://bucket/ledgerview
"""
STATUS_DESCRIPTION = """The last compaction of each partition, in Pulsar's states: NOT_RUN, RUNNING, SUCCESS, ERROR.
For a topic with remote.storage.enable=true, also each partition's upload lag: bytes of sealed segments not yet on
the remote tier ('ledgerview remote status' has the rest).

Exit status 1 when any partition's state is ERROR, so scripts can check the result.

example:
  ledgerview compaction-status prices --wait
"""
WAIT_POLL_S = 0.2


def register(subparsers: Subparsers) -> None:
    compact = add_command(subparsers, "compact", run_compact, help="compact a topic now",
                          description=COMPACT_DESCRIPTION)
    compact.add_argument("topic")
    compact.add_argument("--partition", type=int, action="append", help="compact only this partition (repeatable)")
    compact.add_argument("--json", action="store_true", help="one JSON object per partition")
    compact.add_argument("--spark", metavar="MASTER", help="compact the --remote tier's topic as a Spark job here")
    compact.add_argument("--task-bytes", type=int, metavar="BYTES",
                         help="with --spark: input per task (default: the topic's compaction.memory.bytes)")

    status = add_command(subparsers, "compaction-status", run_status, help="state of the last compaction",
                         description=STATUS_DESCRIPTION)
    status.add_argument("topic")
    status.add_argument("--wait", "-w", action="store_true", help="wait while any partition is RUNNING")
    status.add_argument("--json", action="store_true", help="one JSON object per partition")


def run_compact(args: argparse.Namespace) -> int:
    if args.task_bytes is not None and (args.spark is None or args.task_bytes < 1):
        raise UsageError(f"--task-bytes {args.task_bytes}: it sizes the tasks of a Spark compaction, so it takes "
                         "--spark MASTER and a number of bytes >= 1.")
    if args.spark is not None:
        return _compact_with_spark(args)
    with open_existing_store(args) as store:
        require_topic(store, args.topic)
        partitions = args.partition or list(range(store.topic_metadata(args.topic).partitions))
        compactor = Compactor(store)
        results = [compactor.compact(args.topic, [partition])[0]
                   for partition in progress(partitions, unit="partition", description=f"compacting {args.topic}")]
    return _report(args, results)


def _compact_with_spark(args: argparse.Namespace) -> int:
    if args.remote is None:
        raise UsageError("--spark compacts a topic of a remote tier: give the tier's URI with --remote "
                         "(e.g. --remote s3://bucket/prefix).")
    check_remote_uri(args.remote)
    # Imported here: starting pyspark costs every other command a second.
    from streaming import local_session
    from streaming.compaction import compact_with_spark

    spark = local_session("ledgerview-compact", master=args.spark)
    try:
        results = compact_with_spark(spark, args.remote, args.topic, task_bytes=args.task_bytes,
                                     partitions=args.partition)
    finally:
        spark.stop()
    return _report(args, results)


def _report(args: argparse.Namespace, results: Sequence[CompactionResult]) -> int:
    if args.json:
        for result in results:
            print_json({**vars(result), "messages_removed": result.messages_removed})
        return 0
    print_table(["partition", "ledger", "layers", "horizon", "read", "kept", "removed", "ledger_bytes", "skipped"],
                [(r.partition, r.ledger_id, _layers(r), r.horizon, r.messages_read, r.messages_kept, r.messages_removed,
                  r.ledger_bytes, "yes" if r.skipped else "no") for r in results])
    say(f"Compacted {args.topic}: {sum(r.messages_kept for r in results)} messages in the compacted view.")
    return 0


def _layers(result: CompactionResult) -> int | None:
    """Ledgers the view reads; None (printed ``-``, like its ledger) for a partition never compacted, which has no
    view."""
    return None if result.ledger_id is None else result.layers


def utc_time(epoch_ms: int | None) -> str | None:
    """Milliseconds since the epoch as people read them (``--json`` keeps the numbers)."""
    if epoch_ms is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(sep=" ", timespec="milliseconds").removesuffix("+00:00")


def run_status(args: argparse.Namespace) -> int:
    with open_store_for_reading(args) as store:
        require_topic(store, args.topic)
        compactor = Compactor(store)
        statuses = compactor.status(args.topic)
        while args.wait and any(status.state is CompactionState.RUNNING for status in statuses):
            time.sleep(WAIT_POLL_S)
            statuses = compactor.status(args.topic)
        lags = upload_lags(store, args.topic)
        tiered = store.topic_metadata(args.topic).config.remote_storage_enable
    if args.json:
        for status in statuses:
            print_json({**status.as_record(), "remote_upload_lag_bytes": lags.get(status.partition)})
    else:
        print_table(["partition", "state", "started (UTC)", "ended (UTC)", "read", "kept", "removed", "last_error",
                     *(["upload_lag_bytes"] if tiered else [])],
                    [(s.partition, s.state.value, utc_time(s.started_ms), utc_time(s.ended_ms), s.messages_read,
                      s.messages_kept, s.messages_removed, s.last_error,
                      *([lags.get(s.partition)] if tiered else [])) for s in statuses])
    failed = any(status.state is CompactionState.ERROR for status in statuses)
    return ExitCode.CHECK_FAILED if failed else ExitCode.OK


def upload_lags(store: Store, topic: str) -> dict[int, int | None]:
    """Each partition's remote upload lag in bytes (None: not tiered); a remote tier that is down leaves them
    unknown, with a warning, since the compaction status does not depend on it."""
    try:
        return {partition: store.remote_upload_lag(topic, partition)
                for partition in range(store.topic_metadata(topic).partitions)}
    except RemoteStorageError as error:
        say(f"ledgerview: warning: upload lag unknown: {' '.join(str(error).split())}")
        return {}
