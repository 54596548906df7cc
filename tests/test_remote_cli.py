"""The remote tier on the command line, against the moto S3 server: --remote (remembered by the data folder), a
tiered topic produced, uploaded by 'remote sync', shown by 'remote status' and compaction-status, its local copies
dropped by 'retention' and every message still consumed from a command that names no remote; 'remote claim'
fencing another folder; and bad input (a URI that is no remote tier, a store or topic that is not tiered, a
bucket that cannot take the upload) refused with one line and an exit status, the folder left as it was.
Invariants (DESIGN.md): 2 (offsets never change across the tiers), 10 (bad input gets a clear error and changes
nothing)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from storage import Store
from storage.files import REMOTE_TIER_RECORD
from tests.cli_runner import Completed, run_cli, run_main
from tests.s3_server import S3Server

TIERED = ["--config", "remote.storage.enable=true", "--config", "segment.bytes=2048", "--config",
          "index.interval.bytes=256", "--config", "local.retention.ms=0", "--config", "file.delete.delay.ms=0"]
"""Small segments whose local copies go as soon as they are uploaded."""
MESSAGES = 200


def lines(text: str) -> list[str]:
    return text.splitlines()


def one_error_line(result: Completed, code: int, message: str) -> None:
    assert (result.code, result.out) == (code, "")
    assert len(lines(result.err)) == 1 and result.err.startswith("ledgerview: error: "), result.err
    assert message in result.err


@pytest.mark.slow
def test_sync_status_retention_and_a_reopen_without_remote_read_everything(data_dir: Path, s3_uri: str) -> None:
    run_cli(data_dir, "--remote", s3_uri, "topics", "create", "prices", *TIERED)
    run_cli(data_dir, "produce", "prices", input="".join(f"k{i % 7}\tv{i}\n" for i in range(MESSAGES)))
    [before] = run_cli(data_dir, "remote", "status", "--json").json_lines()
    assert before["upload_lag_bytes"] > 0 and before["remote_end_offset"] is None

    synced = run_cli(data_dir, "remote", "sync")
    [header, row] = lines(synced.out)
    assert header.split() == ["topic", "partition", "segments", "bytes", "offsets", "remote_end"]
    topic, partition, segments, size, offsets, remote_end = row.split()
    assert (topic, partition, size) == ("prices", "0", str(before["upload_lag_bytes"]))
    assert offsets == f"0-{int(remote_end) - 1}" and 0 < int(remote_end) < MESSAGES
    assert f"Uploaded {segments} segment(s), {size} bytes, from 1 partition(s) of 1 tiered topic(s)." in synced.err

    [after] = run_cli(data_dir, "remote", "status", "prices", "--json").json_lines()
    assert (after["upload_lag_bytes"], after["remote_end_offset"], after["remote_bytes"]) == (0, int(remote_end),
                                                                                              int(size))
    assert (after["log_start_offset"], after["local_start_offset"], after["end_offset"]) == (0, 0, MESSAGES)
    assert "upload_lag_bytes" in run_cli(data_dir, "compaction-status", "prices").out

    dropped = run_cli(data_dir, "retention")
    assert f"local copies of {segments} uploaded segment(s), {size} bytes, dropped" in dropped.err
    [local] = run_cli(data_dir, "remote", "status", "--json").json_lines()
    assert (local["log_start_offset"], local["local_start_offset"]) == (0, int(remote_end))
    assert len(list((data_dir / "prices-0").glob("*.log"))) == 1  # only the active segment is local

    consumed = run_cli(data_dir, "consume", "prices", "--from-beginning", "--until-end", "--print-offset")
    assert lines(consumed.out) == [f"{i}\tk{i % 7}\tv{i}" for i in range(MESSAGES)]
    assert run_cli(data_dir, "remote", "claim", "prices", "--partition", "0").out == "2\n"


def test_a_uri_that_is_no_remote_tier_is_refused_and_not_remembered(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Store.open(data_dir).close()
    for uri, message in [("data/tier", "--remote data/tier: a remote tier is a URI such as s3://bucket/prefix"),
                         ("nowhere://bucket/tier", "Unrecognized filesystem type"),
                         ("file://mount/tier", "--remote file://mount/tier: Unsupported hostname"),
                         ("s3://[bucket", "Invalid IPv6 URL")]:
        one_error_line(run_main(capsys, data_dir, "--remote", uri, "topics", "list"), 2, message)
    assert not (data_dir / REMOTE_TIER_RECORD).exists()
    assert run_main(capsys, data_dir, "topics", "list").code == 0


def test_remote_commands_need_a_remote_tier_and_a_tiered_topic(data_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_main(capsys, data_dir, "topics", "create", "plain")
    one_error_line(run_main(capsys, data_dir, "remote", "sync"), 2, "has no remote tier; give --remote")
    tier = f"file://{tmp_path / 'tier'}"
    one_error_line(run_main(capsys, data_dir, "--remote", tier, "remote", "status", "plain"), 2,
                   "Topic 'plain' has remote.storage.enable=false")
    one_error_line(run_main(capsys, data_dir, "remote", "claim", "nope", "--partition", "0"), 3,
                   "Unknown topic 'nope'")
    one_error_line(run_main(capsys, data_dir, "--remote", f"file://{tmp_path / 'other'}", "topics", "list"), 5,
                   f"is tiered to {tier}, not file://{tmp_path / 'other'}")
    one_error_line(run_main(capsys, data_dir, "--remote", tier, "serve"), 2, "the service takes its remote tier "
                                                                             "from [remote] uri")
    listed = run_main(capsys, data_dir, "remote", "sync", "--json")  # no tiered topic: nothing to do
    assert (listed.code, listed.out) == (0, "") and "of 0 tiered topic(s)" in listed.err


def test_a_mount_that_is_not_there_is_named_and_not_taken_for_an_empty_tier(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file:// tier whose folder is gone (its mount not mounted) read as an empty tier: status showed nothing
    uploaded, and sync made the folder again on the local disk and wrote into it."""
    tier = tmp_path / "mount" / "tier"
    assert run_main(capsys, data_dir, "--remote", f"file://{tier}", "topics", "create", "prices", *TIERED).code == 0
    assert tier.is_dir()  # made when the data folder was first tiered there
    with Store.open(data_dir) as store:
        store.append("prices", [(f"k{i}", b"v" * 40) for i in range(MESSAGES)])
    assert run_main(capsys, data_dir, "remote", "sync").code == 0
    tier.parent.rename(tmp_path / "unmounted")
    for command in (["remote", "status"], ["remote", "sync"]):
        one_error_line(run_main(capsys, data_dir, *command), 5, f"the tier's folder {tier} does not exist (is the "
                                                                "shared mount there?)")
    assert not tier.exists()
    (tmp_path / "unmounted").rename(tier.parent)
    assert run_main(capsys, data_dir, "remote", "sync").code == 0


def test_a_bucket_that_cannot_take_the_upload_fails_sync_in_one_line_and_appends_go_on(
        data_dir: Path, s3_server: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"s3://ledgerview-missing-{uuid.uuid4().hex[:12]}/tier"
    assert run_main(capsys, data_dir, "--remote", missing, "topics", "create", "prices", *TIERED).code == 0
    with Store.open(data_dir) as store:
        store.append("prices", [(f"k{i}", b"v" * 40) for i in range(MESSAGES)])
    one_error_line(run_main(capsys, data_dir, "remote", "sync"), 5, f"Remote tier: could not create {missing}/")
    status = run_main(capsys, data_dir, "compaction-status", "prices", "--json")
    assert status.code == 0 and status.json_lines()[0]["remote_upload_lag_bytes"] > 0
    with Store.open(data_dir) as store:
        assert store.end_offset("prices", 0) == MESSAGES


def test_a_folder_whose_partition_another_folder_claimed_is_fenced(data_dir: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tier = f"file://{tmp_path / 'tier'}"
    standby = tmp_path / "standby"
    for folder in (data_dir, standby):
        assert run_main(capsys, folder, "--remote", tier, "topics", "create", "prices", *TIERED).code == 0
        with Store.open(folder) as store:
            store.append("prices", [(f"k{i}", b"v" * 40) for i in range(MESSAGES)])
    assert run_main(capsys, data_dir, "remote", "sync").code == 0
    claimed = run_main(capsys, standby, "remote", "claim", "prices", "--partition", "0")
    assert (claimed.code, claimed.out) == (0, "2\n") and "under epoch 2" in claimed.err
    fenced = run_main(capsys, data_dir, "remote", "sync")
    assert fenced.code == 4 and "belongs to another writer (epoch 2)" in fenced.err
    assert "of 1 tiered topic(s)" in fenced.err
