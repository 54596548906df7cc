"""A hostile outside look at the service (a bug bash): its directory source given lines the topic refuses and files
that come and go, its HTTP server given slow, half-sent and oversized requests. Real subprocesses and real HTTP over
127.0.0.1; nothing of ours is mocked."""

from __future__ import annotations

import json
import select
import shutil
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from compactor import Compactor
from ledgerview.errors import ServiceConfigError
from ledgerview.service.config import parse_service_config
from ledgerview.service.http import StatusServer
from readers import read_table
from storage import Store
from storage.cursors import SubscriptionCursor, write_subscription_cursor
from tests.service_process import ServiceProcess, write_config
from tests.test_console import chromium

pytestmark = pytest.mark.slow  # most start the service as a subprocess: after the fast suite


def _config(tmp_path: Path, *, sources: list[dict[str, Any]], partitions: int = 2,
            topic_config: dict[str, str] | None = None) -> Path:
    return write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(tmp_path / "data")},
        "service": {"flush_interval_s": 0.2},
        "http": {"port": 0},
        "compaction": {"enabled": False},
        "retention": {"enabled": False},
        "cleaner": {"enabled": False},
    }, {
        "topics": [{"name": "prices", "partitions": partitions, "config": topic_config or {}}],
        "sources": sources,
    })


def _directory(incoming: Path, **keys: Any) -> dict[str, Any]:
    return {"name": "drops", "type": "directory", "topic": "prices", "path": str(incoming), "interval_s": 0.05,
            **keys}


def _source(service: ServiceProcess) -> dict[str, Any]:
    source: dict[str, Any] = service.status()["sources"][0]
    return source


def _failed(service: ServiceProcess) -> dict[str, Any]:
    return dict(service.wait_until(lambda: _source(service)["state"] == "failed" and _source(service),
                                   "the source to stop"))


def test_a_line_naming_a_partition_the_topic_lacks_stops_the_source_naming_file_line_and_range(
        tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    lines = [{"key": f"k{i}", "value": f"v{i}", "partition": i % 2} for i in range(5)]
    (incoming / "001.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (incoming / "002.json").write_text('{"key": "a", "value": "ok"}\n\n{"key": "b", "value": "x", "partition": 7}\n')
    service = ServiceProcess(_config(tmp_path, sources=[_directory(incoming, format="json")]))
    failed = _failed(service)
    error = failed["last_error"]
    assert error.startswith("MalformedInputError: "), error
    assert f"{incoming / '002.json'} line 3: 'partition' is 7, and topic 'prices' has partitions 0 to 1" in error
    assert service.status()["topics"][0]["last_errors"] == [f"source drops: {error}"]
    assert service.terminate() == 0
    # As for a malformed line: the files before are in, nothing of the chunk holding the refused line.
    assert read_table(tmp_path / "data", "prices").num_rows == 5


def test_a_line_over_max_message_bytes_is_named_by_file_and_line(
        tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "001.tsv").write_text("k1\tshort\nk2\t" + "x" * 2000 + "\n")
    service = ServiceProcess(_config(tmp_path, sources=[_directory(incoming)],
                                     topic_config={"max.message.bytes": "1000"}))
    error = _failed(service)["last_error"]
    assert f"{incoming / '001.tsv'} line 2: the message is " in error
    assert "over the topic's max.message.bytes=1000" in error
    assert service.terminate() == 0


def _closed_by_server(connection: socket.socket) -> bool:
    """Whether the server closed ``connection`` (an end of file or a reset waits to be read)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1) == b""
    except ConnectionError:
        return True


def test_a_request_sent_a_byte_at_a_time_is_dropped_at_its_deadline_and_the_server_goes_on(
        tmp_path: Path) -> None:
    with Store.open(tmp_path / "data"):
        pass
    server = StatusServer("127.0.0.1", 0, tmp_path / "data", lambda store: {}, lambda: {"status": "ok"},
                          request_timeout_s=1.0)
    server.start()
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as slow:
            slow.sendall(b"GET /health HTTP/1.0\r\n")
            dribble = b"X-Slow: " + b"a" * 100
            closed = False
            for byte in dribble:  # every read arrives well within the timeout, the request never ends
                time.sleep(0.1)
                try:
                    slow.sendall(bytes([byte]))
                except ConnectionError:
                    closed = True
                closed = closed or _closed_by_server(slow)
                if closed:
                    break
            assert closed, "the server still waits for a request that began 10 timeouts ago"
        with urllib.request.urlopen(f"http://{server.address}/health", timeout=30) as response:
            assert json.loads(response.read()) == {"status": "ok"}
    finally:
        server.stop()


def test_the_directory_source_reads_only_regular_files_and_skips_hidden_ones_as_spark_does(tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "001.tsv").write_text("".join(f"k{i}\tv{i}\n" for i in range(10)))
    (incoming / "archive").mkdir()  # a folder matching the pattern
    (incoming / "_SUCCESS").write_text("")
    (incoming / "gone.tsv").symlink_to(incoming / "nowhere")  # a file removed between the listing and the read
    partial = incoming / ".002.tsv.tmp"  # being written, to be renamed when complete, as the docs ask
    partial.write_text("k10\tv10\nk11\tv1")
    service = ServiceProcess(_config(tmp_path, sources=[_directory(incoming)]))
    service.wait_until(lambda: _source(service)["messages"] == 10, "the complete file")
    with partial.open("a") as file:
        file.write("1\n")
    partial.rename(incoming / "002.tsv")
    service.wait_until(lambda: _source(service)["messages"] == 12, "the renamed file")
    assert _source(service)["state"] == "running"
    assert service.terminate() == 0
    values = read_table(tmp_path / "data", "prices")["value"].to_pylist()
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(12))


def test_a_line_too_long_for_any_message_the_topic_takes_is_refused_without_reading_it_whole(
        tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    chunk_bytes = 8 * 1024 * 1024  # what one read of the source takes, and the least it lets a line be
    with (incoming / "001.tsv").open("wb") as file:
        file.write(b"k1\tfirst\n\n")
        file.write(b"k2\t" + b"x" * (3 * chunk_bytes) + b"\n")  # 3 chunks without a line end: no message is that big
        file.write(b"k3\tafter\n")
    service = ServiceProcess(_config(tmp_path, sources=[_directory(incoming)],
                                     topic_config={"max.message.bytes": "1000"}))
    error = _failed(service)["last_error"]
    assert f"{incoming / '001.tsv'} line 3: the line is longer than {chunk_bytes} bytes, the longest read for a " \
           "message of at most the topic's max.message.bytes=1000" in error, error
    assert service.terminate() == 0
    assert read_table(tmp_path / "data", "prices")["value"].to_pylist() == [b"first"]


def _one_damaged_partition(tmp_path: Path) -> tuple[ServiceProcess, Path]:
    """A service on a store of two topics whose topic "damaged" has a partition with an unreadable cursor."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        for topic in ("damaged", "sound"):
            store.create_topic(topic, partitions=2)
            store.append(topic, [{"key": f"k{i}".encode(), "value": b"v"} for i in range(6)])
        Compactor(store).compact("damaged")
        cursor = store.compacted_ledgers("damaged", 1).folder / "cursor.json"
    cursor.write_text("{not json")
    return ServiceProcess(write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(data)}, "http": {"port": 0}, "compaction": {"enabled": False},
        "retention": {"enabled": False}, "cleaner": {"enabled": False}}, {})), cursor


def test_a_damaged_partition_is_named_in_the_status_and_the_others_are_still_reported(tmp_path: Path) -> None:
    service, cursor = _one_damaged_partition(tmp_path)
    try:
        topics = {topic["topic"]: topic["partitions"] for topic in service.status()["topics"]}
        damaged = topics["damaged"][1]
        assert damaged["end_offset"] is None and damaged["compaction"] is None
        assert len(damaged["last_errors"]) == 1
        assert damaged["last_errors"][0].startswith(f"CorruptCompactionCursorError: Compaction cursor {cursor}")
        assert topics["damaged"][0]["horizon"] >= 0 and topics["damaged"][0]["last_errors"] == []
        assert sum(p["end_offset"] for p in topics["sound"]) == 6
        metrics = service.get("/metrics")[2]
        assert 'ledgerview_partition_end_offset{topic="sound",partition="0"}' in metrics
        assert 'ledgerview_partition_end_offset{topic="damaged",partition="1"}' not in metrics
        assert "None" not in metrics
    finally:
        assert service.terminate() == 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_console_shows_a_damaged_partition_with_its_error_beside_the_others(tmp_path: Path) -> None:
    service, _ = _one_damaged_partition(tmp_path)
    try:
        page = chromium("--dump-dom", f"http://{service.address}/", profile=tmp_path / "profile")
        assert "2 topics, 4 partitions" in page, page[:3000]
        assert page.count("<td>sound</td>") == 2
        damaged_row = page[page.index('<td>damaged</td><td class="n">1</td>'):].split("</tr>")[0]
        assert "CorruptCompactionCursorError: Compaction cursor" in damaged_row
    finally:
        assert service.terminate() == 0


@pytest.mark.parametrize(("source", "topic", "message"), [
    ("../../escaped", "prices", "[[sources]] '../../escaped' name: it names the source's checkpoint file, so it "
                                "follows the rule of topic names: Invalid topic name '../../escaped': it contains '/'"),
    ("..", "prices", "Invalid topic name '..': '.' and '..' are reserved"),
    ("", "prices", "Invalid topic name '': it is empty"),
    ("nul\u0000", "prices", "Invalid topic name 'nul\\x00': it contains '\\x00'"),
    ("ticks", "../prices", "[[sources]] 'ticks' topic: Invalid topic name '../prices': it contains '/'"),
])
def test_a_source_name_that_would_leave_the_data_folder_is_refused_with_the_config(
        tmp_path: Path, source: str, topic: str, message: str) -> None:
    raw = {"store": {"data": str(tmp_path / "data")},
           "sources": [{"name": source, "type": "generator", "topic": topic}]}
    with pytest.raises(ServiceConfigError) as refused:
        parse_service_config(raw, "ledgerview.toml")
    assert message in str(refused.value)


def test_a_topic_name_is_checked_with_the_config(tmp_path: Path) -> None:
    with pytest.raises(ServiceConfigError, match=r"\[\[topics\]\] #1 name: Invalid topic name 'a b': it contains ' '"):
        parse_service_config({"topics": [{"name": "a b"}]}, "ledgerview.toml")


@pytest.mark.parametrize(("checkpoint", "problem"), [
    (b"{\"version\": 1, \"posi", "it is not JSON"),
    (b"\xff\xfe", "it is not JSON"),
    (json.dumps({"version": 1, "position": {"seq": 5}, "next_sequence": 5, "end_offsets": [0, 0]}).encode(),
     "its position {'seq': 5} is not one of this source (whose positions have the keys file, offset)"),
    (json.dumps({"version": 1, "position": {"file": "", "offset": 0}, "next_sequence": "x",
                 "end_offsets": None}).encode(), "next_sequence is not a count"),
    (json.dumps({"version": 1, "position": {"file": "", "offset": "x"}, "next_sequence": 0,
                 "end_offsets": None}).encode(), "its position's offset 'x' is not a count"),
])
def test_a_damaged_source_checkpoint_is_named_with_what_is_wrong(tmp_path: Path, checkpoint: bytes,
                                                                 problem: str) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    path = tmp_path / "data" / "__service" / "sources" / "drops.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(checkpoint)
    service = ServiceProcess(_config(tmp_path, sources=[_directory(incoming)]))
    error = _failed(service)["last_error"]
    assert error.startswith(f"CorruptSourceCheckpointError: Source checkpoint {path}: {problem}"), error
    assert "remove it to read the source again from its start" in error
    assert service.terminate() == 0


def _one_damaged_segment(tmp_path: Path) -> tuple[ServiceProcess, Path]:
    """A service on a store of two topics, "damaged" with a flipped byte in its segment, "sound"; a group has a
    position on both."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        for topic in ("damaged", "sound"):
            store.create_topic(topic, partitions=1)
            store.append(topic, [{"key": f"k{i}".encode(), "value": b"v" * 50} for i in range(20)])
            store.flush(topic)
            write_subscription_cursor(store.partition_log(topic, 0).folder, SubscriptionCursor("billing", 0, 5, False,
                                                                                                None, 0))
    segment = data / "damaged-0" / "00000000000000000000.log"
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    segment.write_bytes(bytes(damaged))
    return ServiceProcess(write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(data)}, "http": {"port": 0}, "compaction": {"enabled": False},
        "retention": {"enabled": False}, "cleaner": {"enabled": False}}, {})), segment


def test_a_damaged_segment_is_named_in_the_status_beside_the_other_topics_and_the_groups(tmp_path: Path) -> None:
    service, segment = _one_damaged_segment(tmp_path)
    try:
        status = service.status()
        topics = {topic["topic"]: topic["partitions"] for topic in status["topics"]}
        assert topics["damaged"][0]["last_errors"][0].startswith(f"CorruptSegmentError: Corrupt batch in {segment}")
        assert topics["sound"][0]["end_offset"] == 20
        [billing] = status["groups"]  # listed from the partitions' folders: the damaged log hides no group
        assert status["groups_error"] is None and billing["error"] is None
        damaged, sound = billing["positions"]
        assert (sound["topic"], sound["committed"], sound["end_offset"], sound["lag"]) == ("sound", 5, 20, 15)
        assert (damaged["topic"], damaged["committed"], damaged["end_offset"], damaged["lag"]) == (
            "damaged", 5, None, None)
        assert damaged["error"].startswith(f"CorruptSegmentError: Corrupt batch in {segment}")
        metrics = service.get("/metrics")[2]  # every line a number, or Prometheus drops the whole scrape
        assert 'ledgerview_group_lag{group="billing",topic="sound",partition="0"} 15' in metrics
        assert 'topic="damaged"' not in metrics.split("ledgerview_group_lag", 1)[1] and " None" not in metrics
        if shutil.which("chromium") is not None:
            page = chromium("--dump-dom", f"http://{service.address}/", profile=tmp_path / "profile")
            groups = page[page.index('<table id="groups">'):].split("</table>")[0]
            assert "<td>billing</td><td>sound</td>" in groups
            assert f"unreadable: CorruptSegmentError: Corrupt batch in {segment}" in groups
    finally:
        assert service.terminate() == 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_console_counts_the_lag_behind_the_end_from_the_log_start_when_retention_removed_more(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("prices")
        store.append("prices", [{"key": f"k{i}".encode(), "value": b"v"} for i in range(10)])
        store.delete_records("prices", 0, 6)  # never compacted: the messages left are 6 to 9
    service = ServiceProcess(write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(data)}, "http": {"port": 0}, "compaction": {"enabled": False},
        "retention": {"enabled": False}, "cleaner": {"enabled": False}}, {}))
    try:
        partition = service.status()["topics"][0]["partitions"][0]
        assert (partition["start_offset"], partition["end_offset"], partition["horizon"]) == (6, 10, -1)
        page = chromium("--dump-dom", f"http://{service.address}/", profile=tmp_path / "profile")
        row = page[page.index("<td>prices</td>"):].split("</tr>")[0]
        cells = [cell.removesuffix("</td>") for cell in row.replace('<td class="n">', "<td>").split("<td>")[1:]]
        assert (cells[2], cells[6]) == ("6", "-1")  # start, horizon
        assert cells[7] == "4", row  # lag behind end: 6 to 9 are not in the view
    finally:
        assert service.terminate() == 0


def _exchange(server: StatusServer, request: bytes) -> bytes:
    """The whole answer to a raw request."""
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while block := connection.recv(65536):
            answer += block
    return answer


def test_head_and_an_absolute_request_target_are_answered_as_http_requires(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data"):
        pass
    server = StatusServer("127.0.0.1", 0, tmp_path / "data", lambda store: {}, lambda: {"status": "ok"})
    server.start()
    try:
        head, _, body = _exchange(server, b"HEAD /health HTTP/1.0\r\n\r\n").partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK\r\n") and b"\r\nContent-Length: 16" in head
        assert body == b""  # HEAD: GET's headers without its body (RFC 9110 9.3.2)
        absolute = _exchange(server, f"GET http://{server.address}/health?probe=1 HTTP/1.0\r\n\r\n".encode())
        assert absolute.startswith(b"HTTP/1.0 200 OK\r\n") and absolute.endswith(b'{"status": "ok"}')
    finally:
        server.stop()


def test_a_damaged_cleaner_checkpoint_is_named_in_the_status_of_compact_partitions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("changes", partitions=1, config={"cleanup.policy": "compact"})
        store.create_topic("events", partitions=1)
        for topic in ("changes", "events"):
            store.append(topic, [{"key": b"k", "value": b"v"}] * 3)
    checkpoint = data / "cleaner-offset-checkpoint"
    checkpoint.write_text("0\n1\nchanges zero 5\n")
    service = ServiceProcess(write_config(tmp_path / "ledgerview.toml", {
        "store": {"data": str(data)}, "http": {"port": 0}, "compaction": {"enabled": False},
        "retention": {"enabled": False}, "cleaner": {"interval_s": 3600}}, {}))
    try:
        topics = {topic["topic"]: topic["partitions"][0] for topic in service.status()["topics"]}
        assert topics["changes"]["end_offset"] == 3 and topics["changes"]["cleaner"] is None
        assert any(error.startswith("cleaner: CorruptCheckpointError: ") and str(checkpoint) in error
                   for error in topics["changes"]["last_errors"]), topics["changes"]["last_errors"]
        assert topics["events"]["last_errors"] == []
    finally:
        assert service.terminate() == 0
