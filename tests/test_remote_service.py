"""The service's remote tier, as a real process against the moto S3 server: the upload loop of its [remote] section
uploads what its generator source appends, a pass that fails while the remote tier cannot take the upload is
counted and tried again while appends go on, /status and /metrics show each tiered partition's upload lag, and the
retention loop drops the uploaded local copies while every message stays readable. Bad [remote] values are refused
before anything starts.
Invariants (DESIGN.md): 1 (acknowledged appends survive: here, the loss of their local copies), 10 (a bad config is
refused with a clear error)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from ledgerview.errors import ServiceConfigError
from ledgerview.service.config import parse_service_config
from ledgerview.service.status import partition_statuses, prometheus_text
from storage import Store
from tests.conftest import ManualClock
from tests.s3_server import S3Server
from tests.service_process import ServiceProcess, write_config

MESSAGES = 600


def tiered_service_config(tmp_path: Path, uri: str) -> Path:
    return write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")},
        "service": {"flush_interval_s": 0.2},
        "http": {"port": 0},
        "compaction": {"enabled": False},
        "cleaner": {"enabled": False},
        "retention": {"interval_s": 0.2},
        "remote": {"uri": uri, "interval_s": 0.2},
    }, {
        "topics": [{"name": "prices", "partitions": 1,
                    "config": {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0",
                               "file.delete.delay.ms": "0"}}],
        "sources": [{"name": "ticks", "type": "generator", "topic": "prices", "batch_messages": 100,
                     "interval_s": 0.01, "keys": 50, "value_bytes": 24, "limit": MESSAGES}],
    })


def partition(service: ServiceProcess) -> dict[str, Any]:
    found: dict[str, Any] = service.status()["topics"][0]["partitions"][0]
    return found


@pytest.mark.slow
def test_the_upload_loop_uploads_what_the_source_appends_and_status_shows_the_lag(tmp_path: Path,
                                                                                  s3_server: S3Server) -> None:
    bucket = f"ledgerview-service-{uuid.uuid4().hex[:12]}"  # created only later: until then every pass fails
    service = ServiceProcess(tiered_service_config(tmp_path, f"s3://{bucket}/tier"))
    try:
        service.wait_until(lambda: service.status()["sources"][0]["next_sequence"] == MESSAGES, "every message")
        failing = service.wait_until(lambda: service.status()["loops"]["remote"]["errors"] >= 2 and service.status(),
                                     "two failed upload passes")
        assert failing["loops"]["remote"]["last_error"].startswith("RemoteStorageError: Remote tier: could not")
        assert partition(service)["end_offset"] == MESSAGES  # appends went on
        lag = partition(service)["remote_upload_lag_bytes"]
        assert lag > 0
        assert f'ledgerview_remote_upload_lag_bytes{{topic="prices",partition="0"}} {lag}' in service.get("/metrics")[2]
        assert any(event["event"] == "remote.failed" for event in service.events)

        boto3.client("s3").create_bucket(Bucket=bucket)  # the remote tier comes back: the next pass uploads
        service.wait_until(lambda: partition(service)["remote_upload_lag_bytes"] == 0, "no upload lag")
        uploaded = [event for event in service.events if event["event"] == "remote.uploaded"]
        assert uploaded and uploaded[-1]["topic"] == "prices" and uploaded[-1]["remote_end_offset"] > 0
        assert 'ledgerview_remote_upload_lag_bytes{topic="prices",partition="0"} 0' in service.get("/metrics")[2]
        # local.retention.ms=0: the retention loop drops the uploaded local copies; the log still starts at 0.
        dropped = service.wait_until(lambda: partition(service)["segments"] == 1 and partition(service),
                                     "the local copies dropped")
        assert dropped["start_offset"] == 0 and dropped["end_offset"] == MESSAGES
        assert service.terminate() == 0
    finally:
        service.kill()
    with Store.open(tmp_path / "data") as store:  # no remote named: the folder remembers it
        assert store.partition_log("prices", 0).segments[0].base_offset > 0
        assert store.read("prices", 0, 0).column("offset").to_pylist() == list(range(MESSAGES))


def test_the_status_answers_with_local_figures_while_the_remote_log_cannot_be_read(tmp_path: Path,
                                                                                 clock: ManualClock) -> None:
    tier = tmp_path / "tier"
    with Store.open(tmp_path / "data", remote=f"file://{tier}", clock=clock) as store:
        store.create_topic("t", 1, {"remote.storage.enable": "true", "segment.bytes": "2048",
                                    "local.retention.ms": "0", "file.delete.delay.ms": "0"})
        store.append("t", [(f"k{i}", b"v" * 40) for i in range(200)], partition=0)
        store.sync_remote()
        clock.advance(1)
        store.enforce_retention("t")  # only the active segment stays local
        [healthy] = partition_statuses(store, "t", None)
        assert healthy["remote_upload_lag_bytes"] == 0 and healthy["last_errors"] == []
        store.append("t", [(f"k{i}", b"v" * 40) for i in range(60)], partition=0)  # rolls: a lag again
    manifests = tier / "t-0" / "manifests"
    manifests.rename(tmp_path / "manifests-away")
    manifests.write_text("the remote log cannot be listed now")
    with Store.open(tmp_path / "data", clock=clock) as store:
        [degraded] = partition_statuses(store, "t", None)
        log = store.partition_log("t", 0)
        assert degraded["size_bytes"] == log.local_size_bytes < healthy["size_bytes"]
        [error] = degraded["last_errors"]
        assert error.startswith(f"Remote tier: could not list file://{manifests}: NotADirectoryError")
        assert error.endswith("Sizes count local segments only.")
        lag = sum(segment.size_bytes for segment in log.segments[:-1])
        # From the last manifest this process saw (the sync above), without a request.
        assert lag > 0 and degraded["remote_upload_lag_bytes"] == lag
        assert degraded["end_offset"] == 260 and degraded["start_offset"] == 0
    metrics = prometheus_text({"uptime_s": 1, "topics": [{"topic": "t", "partitions": [degraded]}], "sources": [],
                               "loops": {}, "groups": []})
    assert f'ledgerview_remote_upload_lag_bytes{{topic="t",partition="0"}} {lag}' in metrics


@pytest.mark.parametrize(("uri", "message"), [
    ("data/tier", "is not an s3:// or file:// URI"),
    ("gs://bucket/tier", "is not an s3:// or file:// URI"),
    ("s3:///tier", "names no bucket"),
    ("file://mount/tier", "is not an absolute local path"),
    ("s3://[bucket", "Invalid IPv6 URL"),
])
def test_the_remote_section_refuses_a_uri_no_upload_could_use(uri: str, message: str) -> None:
    with pytest.raises(ServiceConfigError, match=rf"\[remote\] uri: '{re.escape(uri)}'.*{message}"):
        parse_service_config({"remote": {"uri": uri}}, "service.toml")


def test_the_remote_section_checks_its_keys_and_has_defaults() -> None:
    with pytest.raises(ServiceConfigError, match=r"\[remote\] interval_s: 0 is not above 0 seconds"):
        parse_service_config({"remote": {"interval_s": 0}}, "service.toml")
    with pytest.raises(ServiceConfigError, match=r"\[remote\] url: unknown key; keys: uri, enabled, interval_s"):
        parse_service_config({"remote": {"url": "s3://bucket/tier"}}, "service.toml")
    remote = parse_service_config({"remote": {"uri": "file:///mnt/tier"}}, "service.toml").remote
    assert (remote.uri, remote.enabled, remote.interval_s) == ("file:///mnt/tier", True, 30.0)
    assert parse_service_config({}, "service.toml").remote.uri == ""
