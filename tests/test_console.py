"""The service's web console as a person sees it: headless Chromium (Debian's package) loads the page from a
running service and what it shows is checked: topics and partitions with their sizes, horizon and compaction
state, a group with its lag, the sources and loops, and the rate charts. Also what /health and /metrics say
beside it: /health from the service's own counters, /metrics with compaction counters, group lag, process metrics
and build info."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from storage import Store
from storage.cursors import SubscriptionCursor, write_subscription_cursor
from tests.service_process import ServiceProcess, write_config

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=4000"]


def chromium(*arguments: str, profile: Path) -> str:
    """Run headless Chromium with a fresh profile; its stdout."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *arguments],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _settled(partitions: list[dict]) -> bool:
    """Every message in, each partition's last compaction a success that covers its end: below the threshold, the
    loop starts no run, so the state the page shows cannot turn RUNNING while Chromium loads it."""
    return (sum(p["end_offset"] for p in partitions) == 2000
            and all(p["compaction"]["state"] == "SUCCESS" and p["horizon"] == p["end_offset"] - 1 for p in partitions))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_the_console_shows_the_service_as_its_status_says(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(data)}, "service": {"flush_interval_s": 0.2}, "http": {"port": 0},
        "compaction": {"interval_s": 0.2},
    }, {
        "topics": [{"name": "prices", "partitions": 2, "config": {"compaction.threshold.bytes": "2000"}}],
        "sources": [{"name": "ticks", "type": "generator", "topic": "prices", "batch_messages": 100,
                     "interval_s": 0.02, "keys": 50, "value_bytes": 24, "limit": 2000, "tombstone_every": 0}],
    })
    service = ServiceProcess(config)
    try:
        service.wait_until(lambda: _settled(service.status()["topics"][0]["partitions"]) or None,
                           "all 2,000 messages compacted, so no further compaction starts")
        with Store.open(data) as store:
            write_subscription_cursor(store.partition_log("prices", 1).folder,
                                      SubscriptionCursor("dashboard", 1, 5, True, None, 0))
        code, _, health = service.get("/health")
        assert code == 200 and set(json.loads(health)) == {"status", "failed_sources", "uptime_s"}
        metrics = service.get("/metrics")[2]
        for family in ("ledgerview_compaction_runs_total", "ledgerview_compaction_messages_read_total",
                       "ledgerview_partition_compaction_last_success_timestamp_seconds", "ledgerview_group_lag",
                       "process_resident_memory_bytes", "process_cpu_seconds_total", "ledgerview_build_info"):
            assert f"# TYPE {family} " in metrics
        assert 'ledgerview_group_lag{group="dashboard",topic="prices",partition="1"}' in metrics

        page = chromium("--dump-dom", f"http://{service.address}/", profile=tmp_path / "profile")
        assert "refreshed" in page and "topics, 2 partitions" in page
        status = service.status()
        for partition in status["topics"][0]["partitions"]:
            assert f"<td>prices</td><td class=\"n\">{partition['partition']}</td>" in page
        assert page.count("<td>SUCCESS 20") == 2  # each partition's last compaction, with its end time
        assert "<td>dashboard</td><td>prices</td><td class=\"n\">1</td><td class=\"n\">5</td>" in page
        assert "<td>ticks</td><td>source (generator)</td>" in page and "<td>compaction</td><td>loop</td>" in page
        assert "messages ingested" in page and "<svg" in page
        screenshot = tmp_path / "console.png"
        chromium("--window-size=1400,900", f"--screenshot={screenshot}", f"http://{service.address}/",
                 profile=tmp_path / "profile-2")
        assert screenshot.stat().st_size > 10_000
        if (keep := os.environ.get("LEDGERVIEW_CONSOLE_SCREENSHOT")):
            shutil.copyfile(screenshot, keep)  # how docs/console.png is made
    finally:
        service.terminate()
