"""``ledgerview remote sync|status|claim``: the store's remote tier (storage/remote_tier.py) by hand, what the
service's upload loop does continuously."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ledgerview.commands.common import (
    Subparsers,
    add_command,
    open_existing_store,
    print_json,
    print_table,
    require_topic,
    say,
)
from ledgerview.errors import UsageError
from ledgerview.exit_codes import ExitCode
from ledgerview.progress import progress
from storage import Store
from storage.remote_log import RemoteSyncRefusal
from storage.remote_tier import RemoteSyncResult

GROUP_DESCRIPTION = """The store's remote tier: sealed segments of topics with remote.storage.enable=true are
uploaded to object storage (the URI given once with --remote; the data folder remembers it), read from there once
local retention (local.retention.ms, local.retention.bytes; run by 'ledgerview retention') has dropped their local
copies, and expired from there by retention.ms and retention.bytes. The active segment is never uploaded."""
SYNC_DESCRIPTION = """Upload now every sealed segment the remote tier lacks, of TOPIC or of every tiered topic, and
print per partition what was uploaded and the remote end offset (the remote tier holds every message below it).

A topic whose remote log another data folder has claimed is named on stderr and the command exits 4; the other
topics are still uploaded. A remote tier that is down stops the command with exit status 5; nothing local changes.

examples:
  ledgerview --remote s3://bucket/ledgerview remote sync
  ledgerview remote sync prices --json
"""
STATUS_DESCRIPTION = """Per partition of TOPIC, or of every tiered topic: the log start offset (reads below it are
out of range), the first offset still in the local folder, the remote end offset, the end offset, the bytes on the
remote tier, the upload lag (bytes of sealed segments not yet uploaded: what a lost disk would lose) and the epoch
of the data folder that writes the remote log. Reads the remote log now.

example:
  ledgerview remote status prices
"""
CLAIM_DESCRIPTION = """Make this data folder the writer of a partition's remote log, as a standby taking over does:
the remote log is published again under a new epoch, printed on stdout, and writers of older epochs are refused
from then on (their uploads exit 4). Claim only when this folder's log continues the remote one.

example:
  ledgerview remote claim prices --partition 0
"""


def register(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("remote", help="upload to the remote tier now, its status, claim a partition",
                                  description=GROUP_DESCRIPTION)
    remote = group.add_subparsers(dest="remote_command", required=True, metavar="ACTION")

    sync = add_command(remote, "sync", run_sync, help="upload sealed segments to the remote tier now",
                       description=SYNC_DESCRIPTION)
    sync.add_argument("topic", nargs="?", help="the topic to upload (default: every topic with "
                                               "remote.storage.enable=true)")
    sync.add_argument("--json", action="store_true", help="one JSON object per partition")

    status = add_command(remote, "status", run_status, help="upload lag and offsets of tiered partitions",
                         description=STATUS_DESCRIPTION)
    status.add_argument("topic", nargs="?", help="the topic (default: every topic with remote.storage.enable=true)")
    status.add_argument("--json", action="store_true", help="one JSON object per partition")

    claim = add_command(remote, "claim", run_claim, help="make this folder the writer of a partition's remote log",
                        description=CLAIM_DESCRIPTION)
    claim.add_argument("topic")
    claim.add_argument("--partition", type=int, required=True)


def tiered_topics(store: Store, topic: str | None) -> list[str]:
    """``[topic]``, checked to be tiered, or every tiered topic; a usage error when the store has no remote tier."""
    if store.remote is None:
        raise UsageError(f"The store at {store.root} has no remote tier; give --remote s3://bucket/prefix (or "
                         "file:///mount/prefix) once, and the data folder remembers it.")
    if topic is None:
        return [name for name in store.list_topics() if store.topic_metadata(name).config.remote_storage_enable]
    require_topic(store, topic)
    if not store.topic_metadata(topic).config.remote_storage_enable:
        raise UsageError(f"Topic {topic!r} has remote.storage.enable=false, so nothing of it goes to the remote tier; "
                         f"tier it with 'ledgerview topics alter {topic} --config remote.storage.enable=true'.")
    return [topic]


def run_sync(args: argparse.Namespace) -> int:
    results: list[RemoteSyncResult] = []
    refused: list[RemoteSyncRefusal] = []
    with open_existing_store(args) as store:
        topics = tiered_topics(store, args.topic)
        for topic in progress(topics, unit="topic", description="uploading"):
            try:
                results += store.sync_remote(topic)
            except RemoteSyncRefusal as refusal:  # its other partitions were synced, and the other topics go on
                results += refusal.synced
                refused += [refusal, *refusal.also_refused]
    if args.json:
        for result in results:
            print_json({"topic": result.topic, "partition": result.partition,
                        "uploaded": [{"base_offset": s.base_offset, "next_offset": s.next_offset,
                                      "size_bytes": s.size_bytes} for s in result.uploaded],
                        "uploaded_bytes": sum(s.size_bytes for s in result.uploaded),
                        "remote_end_offset": result.remote_end_offset})
    elif results:
        print_table(["topic", "partition", "segments", "bytes", "offsets", "remote_end"],
                    [(r.topic, r.partition, len(r.uploaded), sum(s.size_bytes for s in r.uploaded),
                      f"{r.uploaded[0].base_offset}-{r.uploaded[-1].next_offset - 1}" if r.uploaded else None,
                      r.remote_end_offset) for r in results])
    for error in refused:
        say(f"ledgerview: error: {' '.join(str(error).split())}")
    uploaded = [segment for result in results for segment in result.uploaded]
    say(f"Uploaded {len(uploaded)} segment(s), {sum(s.size_bytes for s in uploaded)} bytes, from {len(results)} "
        f"partition(s) of {len(topics)} tiered topic(s).")
    return ExitCode.CONFLICT if refused else ExitCode.OK


def run_status(args: argparse.Namespace) -> int:
    rows = []
    with open_existing_store(args) as store:
        for topic in tiered_topics(store, args.topic):
            rows += [partition_status(store, topic, partition)
                     for partition in range(store.topic_metadata(topic).partitions)]
    if args.json:
        for row in rows:
            print_json(row)
    else:
        print_table(["topic", "partition", "log_start", "local_start", "remote_end", "end", "remote_bytes",
                     "upload_lag_bytes", "epoch"],
                    [(r["topic"], r["partition"], r["log_start_offset"], r["local_start_offset"],
                      r["remote_end_offset"], r["end_offset"], r["remote_bytes"], r["upload_lag_bytes"], r["epoch"])
                     for r in rows])
    return ExitCode.OK


def partition_status(store: Store, topic: str, partition: int) -> dict[str, object]:
    """The partition's offsets on both tiers, from its remote log read now."""
    return {"topic": topic, "partition": partition, **asdict(store.remote_status(topic, partition))}


def run_claim(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        tiered_topics(store, args.topic)
        epoch = store.claim_remote(args.topic, args.partition)
    print(epoch)
    say(f"This data folder now writes the remote log of {args.topic}-{args.partition} under epoch {epoch}; writers "
        "of older epochs are refused from now on.")
    return ExitCode.OK
