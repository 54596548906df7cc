"""The service as a real subprocess: ingest from its sources, automatic compaction past the threshold, SIGTERM
then restart and kill -9 then restart with nothing lost and nothing repeated, the status endpoint's JSON and the
metrics text, bad configs refused before anything starts.
Invariants (DESIGN.md): 1 (acknowledged appends survive kill -9), 4 (the compacted view after automatic
compaction), 10 (a bad config or a malformed source line is refused with a clear error; nothing is lost)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ledgerview.service.ingest import read_sequences
from readers import TableView, read_table
from storage import Store
from tests.cli_runner import SPARK_TIMEOUT_S, run_cli
from tests.service_process import ServiceProcess, write_config

KEYS = 40


def config(tmp_path: Path, *, sources: list[dict[str, Any]], threshold_bytes: int = 0,
           partitions: int = 3) -> Path:
    return write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")},
        "service": {"flush_interval_s": 0.2},
        "http": {"port": 0},
        "compaction": {"interval_s": 0.2},
        "retention": {"interval_s": 0.5},
    }, {
        "topics": [{"name": "prices", "partitions": partitions,
                    "config": {"compaction.threshold.bytes": str(threshold_bytes)}}],
        "sources": sources,
    })


def generator(limit: int, *, batch: int = 250, interval_s: float = 0.02) -> dict[str, Any]:
    return {"name": "ticks", "type": "generator", "topic": "prices", "batch_messages": batch,
            "interval_s": interval_s, "keys": KEYS, "value_bytes": 24, "limit": limit, "tombstone_every": 0}


def source_status(service: ServiceProcess) -> dict[str, Any]:
    status: dict[str, Any] = service.status()["sources"][0]
    return status


def assert_exactly_once(data: Path, count: int) -> None:
    """Every generated message is in the topic exactly once, with the value the generator gives it."""
    with Store.open(data) as store:
        found = read_sequences(store, "prices", "ticks", None)
    for sequences in found.values():
        assert (np.diff(sequences) > 0).all(), "each partition holds its messages in source order"
    np.testing.assert_array_equal(np.sort(np.concatenate(list(found.values()))), np.arange(count))
    table = read_table(data, "prices")
    values = sorted(value.decode().rstrip(".") for value in table["value"].to_pylist())
    assert values == sorted(f"n={n}" for n in range(count))


@pytest.mark.slow
def test_ingest_compact_report_then_stop_and_restart(tmp_path: Path) -> None:
    service = ServiceProcess(config(tmp_path, sources=[generator(3000)], threshold_bytes=20_000))
    service.wait_until(lambda: source_status(service)["next_sequence"] == 3000, "3000 generated messages")

    def compacted_everything() -> dict[str, Any] | None:
        status = service.status()
        partitions = status["topics"][0]["partitions"]
        done = all(p["compaction"]["state"] == "SUCCESS" and p["dirty_bytes"] <= 20_000 for p in partitions)
        return status if done else None

    status = service.wait_until(compacted_everything, "automatic compaction of every partition")
    partitions = status["topics"][0]["partitions"]
    assert [p["partition"] for p in partitions] == [0, 1, 2]
    assert sum(p["end_offset"] for p in partitions) == 3000
    assert all(p["horizon"] >= 0 and p["compacted_messages"] > 0 and 0 <= p["dirty_ratio"] < 1 for p in partitions)
    assert all(1 <= p["compacted_layers"] <= 4 for p in partitions)  # compaction.max.layers' default bounds them
    assert status["status"] == "ok" and status["sources"][0]["state"] == "running"
    assert status["loops"]["compaction"]["runs"] >= 1
    assert any(event["event"] == "compaction.done" for event in service.events)

    code, content_type, metrics = service.get("/metrics")
    assert code == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert 'ledgerview_source_messages_total{source="ticks",topic="prices"} 3000' in metrics
    assert 'ledgerview_partition_compaction_state{topic="prices",partition="0",state="SUCCESS"} 1' in metrics
    assert "# TYPE ledgerview_partition_end_offset gauge" in metrics
    assert "# TYPE ledgerview_partition_compacted_layers gauge" in metrics
    ends = {line.split(" ")[0]: int(line.split(" ")[1]) for line in metrics.splitlines()
            if line.startswith("ledgerview_partition_end_offset{")}
    assert sum(ends.values()) == 3000
    assert service.get("/health")[2].startswith('{"status": "ok"')

    config_file = str(tmp_path / "ledgerview.toml")
    second = subprocess.run([sys.executable, "-m", "ledgerview", "serve", "--config", config_file],
                            capture_output=True, timeout=60)
    assert second.returncode == 4 and b"Another ledgerview service runs on the data folder" in second.stderr

    assert service.terminate() == 0
    assert service.events[-1]["event"] == "service.stopped"
    assert service.events[-1]["messages"] == {"ticks": 3000}

    restarted = ServiceProcess(config(tmp_path, sources=[generator(3000)], threshold_bytes=20_000))
    recovered = restarted.wait_for_event("source.recovered")
    assert (recovered["next_sequence"], recovered["appended_again"]) == (3000, 0)
    assert restarted.terminate() == 0
    assert_exactly_once(tmp_path / "data", 3000)
    with TableView(tmp_path / "data", "prices") as view:
        assert len(view) == KEYS
        assert view.get(b"key000007") == f"n={3000 - KEYS + 7}".ljust(24, ".").encode()


@pytest.mark.fault
def test_kill_9_then_restart_loses_and_repeats_nothing(tmp_path: Path) -> None:
    path = config(tmp_path, sources=[generator(20_000, batch=200, interval_s=0.01)], threshold_bytes=50_000)
    first = ServiceProcess(path)
    first.wait_until(lambda: source_status(first)["messages"] >= 3000, "3000 messages before the kill")
    first.kill()

    second = ServiceProcess(path)
    second.wait_until(lambda: source_status(second)["next_sequence"] == 20_000, "the rest of the messages")
    assert second.terminate() == 0
    assert_exactly_once(tmp_path / "data", 20_000)
    assert run_cli(tmp_path / "data", "verify").code == 0


@pytest.mark.fault
@pytest.mark.parametrize("crash_at", ["segment.after_write:5", "segment.torn_write:4",
                                      "ingest.before_checkpoint:2"])
def test_a_crash_inside_an_append_or_before_a_checkpoint_is_replayed_exactly(tmp_path: Path, crash_at: str) -> None:
    """The crash lands between the partitions of one append, inside a batch, or after appends the checkpoint does
    not cover (the first hit is the flush at the end of recovery): recovery appends exactly the missing messages."""
    path = config(tmp_path, sources=[generator(5000, batch=100, interval_s=0.01)])
    crashing = ServiceProcess(path, environment={"LEDGERVIEW_CRASH_AT": crash_at})
    assert crashing.wait_for_exit() == -9

    restarted = ServiceProcess(path)
    restarted.wait_until(lambda: source_status(restarted)["next_sequence"] == 5000, "every message")
    assert restarted.terminate() == 0
    recovered = next(event for event in restarted.events if event["event"] == "source.recovered")
    assert recovered["already_present"] > 0
    assert_exactly_once(tmp_path / "data", 5000)


@pytest.mark.slow
def test_directory_source_ingests_files_and_stops_at_a_malformed_line(tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "001.tsv").write_text("".join(f"k{i % 5}\tv{i}\n" for i in range(100)))
    (incoming / "002.tsv").write_text("k1\t-\nk2\tlast\n")
    (incoming / "ignored.txt").write_text("not matched by the pattern\n")
    drops = {"name": "drops", "type": "directory", "topic": "prices", "path": str(incoming), "pattern": "*.tsv",
             "null_marker": "-", "interval_s": 0.05}
    service = ServiceProcess(config(tmp_path, sources=[drops], partitions=1))
    service.wait_until(lambda: source_status(service)["messages"] == 102, "both files")
    (incoming / "003.tsv").write_text("k3\tok\nno separator\n")
    failed = service.wait_until(lambda: source_status(service)["state"] == "failed" and source_status(service),
                                "the source to stop at the bad line")
    assert "003.tsv line 2: no separator" in failed["last_error"]
    topic_errors = service.status()["topics"][0]["last_errors"]
    assert len(topic_errors) == 1 and topic_errors[0].startswith("source drops: MalformedInputError:")
    assert service.get("/health")[2].startswith('{"status": "degraded", "failed_sources": ["drops"]')
    assert service.terminate() == 0

    table = read_table(tmp_path / "data", "prices")
    assert table.num_rows == 102
    assert table["value"].to_pylist()[-2:] == [None, b"last"]


@pytest.mark.slow
def test_the_cleaner_loop_cleans_compact_topics_in_place(tmp_path: Path) -> None:
    path = write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")}, "service": {"flush_interval_s": 0.2}, "http": {"port": 0},
        "cleaner": {"interval_s": 0.2},
    }, {
        "topics": [{"name": "users", "config": {"cleanup.policy": "compact", "segment.bytes": "2048",
                                                 "min.cleanable.dirty.ratio": "0.01"}}],
        "sources": [{"name": "profiles", "type": "generator", "topic": "users", "batch_messages": 20,
                     "interval_s": 0.01, "keys": 5, "value_bytes": 24, "limit": 600}],
    })
    service = ServiceProcess(path)

    def cleaned() -> dict[str, Any] | None:
        status = service.status()
        if status["sources"][0]["next_sequence"] < 600:
            return None
        cleaner = status["topics"][0]["partitions"][0]["cleaner"]
        return cleaner if cleaner["first_dirty_offset"] > 0 and cleaner["state"] == "idle" else None

    cleaner = service.wait_until(cleaned, "a cleaning pass over the generated messages")
    assert cleaner["uncleanable"] is None and 0 <= cleaner["dirty_ratio"] <= 1
    assert any(event["event"] == "cleaner.cleaned" for event in service.events)
    metrics = service.get("/metrics")[2]
    assert 'ledgerview_partition_cleaner_first_dirty_offset{topic="users",partition="0"}' in metrics
    assert service.terminate() == 0

    table = read_table(tmp_path / "data", "users")
    assert table.num_rows < 600
    latest = dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
    assert latest == {f"key{k:06d}".encode(): f"n={595 + k}".ljust(24, ".").encode() for k in range(5)}


@pytest.mark.slow
@pytest.mark.spark
def test_demo_runs_and_checks_itself(tmp_path: Path) -> None:
    """The demo (which streams through Spark) exits 0 only when its own checks of both views pass."""
    result = run_cli(tmp_path / "unused", "demo", "--data", str(tmp_path / "demo"), "--ticks", "20000",
                     timeout_s=SPARK_TIMEOUT_S)
    assert result.out.startswith(f"ledgerview demo: data folder {tmp_path / 'demo'}")


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_a_bad_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = write_config(tmp_path / "bad.toml", {"store": {"data": str(tmp_path / "data")}, "http": {"prot": 1}}, {})
    result = subprocess.run([sys.executable, "-m", "ledgerview", "serve", "--config", str(bad)],
                            capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == (
        f"ledgerview: error: Service config {bad}: [http] prot: unknown key; keys: enabled, host, port, tokens_file, "
        "insecure, max_connections, max_connections_per_ip. "
        "See conf/ledgerview.toml for every key.")
    assert not (tmp_path / "data").exists()


def test_the_default_config_is_valid() -> None:
    from ledgerview.service.config import read_service_config

    default = read_service_config(Path(__file__).resolve().parent.parent / "conf" / "ledgerview.toml")
    assert [source.type for source in default.sources] == ["generator"]
    assert default.http.host == "127.0.0.1" and not default.kafka.enabled


@pytest.mark.slow
def test_the_service_serves_kafka_clients_when_its_kafka_section_is_enabled(tmp_path: Path) -> None:
    """[kafka] enabled: a real kafka-python producer writes through the service's endpoint and a consumer reads
    the compacted name after the service's own compaction loop has compacted the topic."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    path = config(tmp_path, sources=[], threshold_bytes=1, partitions=1)
    path.write_text(path.read_text() + '\n[kafka]\nenabled = true\nport = 0\n')
    service = ServiceProcess(path)
    try:
        bootstrap = str(service.wait_for_event("service.started")["kafka"])
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for n in range(20):
            producer.send("prices", key=b"k%d" % (n % 4), value=b"v%d" % n)
        producer.flush()
        producer.close()
        service.wait_until(lambda: service.status()["topics"][0]["partitions"][0]["horizon"] == 19,
                           "the compaction of what the producer sent")
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=5000)
        target = TopicPartition("prices.compacted", 0)
        consumer.assign([target])
        consumer.seek_to_beginning(target)
        compacted = [(record.offset, record.key, record.value) for record in consumer]
        consumer.close()
        assert compacted == [(16 + i, b"k%d" % i, b"v%d" % (16 + i)) for i in range(4)]
        assert service.terminate() == 0
    finally:
        service.kill()
    with Store.open(tmp_path / "data") as store:
        assert store.read("prices", 0)["value"].to_pylist() == [b"v%d" % n for n in range(20)]
