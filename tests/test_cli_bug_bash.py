"""What a bug bash of the command line found, mended, each through ``ledgerview.cli.main`` in this process: JSON
lines that give a timestamp or partition only on some lines, out-of-range integers named by their line, --file on
pipes and folders, topics create's partition count, dump-log on a data folder, the compact table of a partition
never compacted, and the exit statuses --help and docs/cli.md list. Invariant 10 (DESIGN.md): bad input gets a
clear error and loses nothing."""

from __future__ import annotations

import errno
import io
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from ledgerview.exit_codes import EXIT_CODES_HELP, ExitCode, exit_code_for
from ledgerview.input_lines import LineFormat, parse_chunk
from storage import Store
from storage.partitioner import partition_for_keys
from storage.remote_log import RemoteLogOwnedError
from tests.cli_runner import Completed, run_main

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


Produce = Callable[..., Completed]
"""``produce(topic, lines, *args)``: ``ledgerview produce TOPIC ARGS`` with ``lines`` on stdin."""


@pytest.fixture
def produce(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> Produce:

    def run(topic: str, lines: str, *args: str) -> Completed:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
        return run_main(capsys, data_dir, "produce", topic, *args)

    return run


def stored(data: Path, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, timestamp, key, value) of every message, partition by partition in offset order."""
    with Store.open(data) as store:
        return [(m.partition, m.timestamp, m.key, m.value)
                for partition in range(store.topic_metadata(topic).partitions)
                for m in store.iter_messages(topic, partition)]


def create(capsys: pytest.CaptureFixture[str], data: Path, topic: str, *args: str) -> None:
    assert run_main(capsys, data, "topics", "create", topic, *args).code == 0


def assert_refused(result: Completed, line: int, reason: str, written: int) -> None:
    assert (result.code, result.out) == (ExitCode.USAGE, "")
    assert len(result.err.splitlines()) == 1 and "Traceback" not in result.err
    assert f"stdin line {line}: {reason}" in result.err
    assert f"{written} messages before it were written, nothing from this line on" in result.err


def test_json_lines_give_a_timestamp_and_a_partition_each_for_itself(
        capsys: pytest.CaptureFixture[str], data_dir: Path, produce: Produce) -> None:
    create(capsys, data_dir, "t", "--partitions", "3")
    lines = ('{"key": "x", "value": "1"}\n'
             '{"key": "y", "value": "2", "timestamp": 1763820000000, "partition": 2}\n'
             '{"key": "z", "value": "3", "timestamp": null, "partition": null}\n'
             '{"key": "w", "value": "4", "partition": 0}\n')
    assert produce("t", lines, "--json").code == 0
    where = dict(zip([b"x", b"z"], partition_for_keys(pa.array([b"x", b"z"], pa.binary()), 3).tolist(),
                     strict=True))
    messages = {key: (partition, timestamp) for partition, timestamp, key, _ in stored(data_dir, "t")}
    assert messages[b"y"] == (2, 1763820000000)
    assert messages[b"w"][0] == 0
    assert (messages[b"x"][0], messages[b"z"][0]) == (where[b"x"], where[b"z"])
    assert all(messages[key][1] > 1763820000000 for key in (b"x", b"z", b"w"))  # the time of the append


@pytest.mark.parametrize(("field", "reason"), [
    ('"timestamp": -1', "'timestamp' is -1; expected an integer from 0 to 9223372036854775807"),
    ('"timestamp": 9223372036854775808', "'timestamp' is 9223372036854775808; expected an integer from 0 to "
                                         "9223372036854775807 (milliseconds since the epoch), or null"),
    ('"partition": 2147483648', "'partition' is 2147483648; expected an integer from 0 to 2147483647"),
    ('"partition": -1', "'partition' is -1; expected an integer from 0 to 2147483647"),
    ('"partition": 9', "'partition' is 9, and topic 't' has partitions 0 to 0 (leave it out, or null"),
])
def test_a_bad_timestamp_or_partition_is_named_by_its_line(capsys: pytest.CaptureFixture[str], data_dir: Path,
                                                           produce: Produce, field: str, reason: str) -> None:
    create(capsys, data_dir, "t")
    result = produce("t", f'{{"value": "a"}}\n\n{{"value": "b", {field}}}\n{{"value": "c"}}\n', "--json")
    assert_refused(result, 3, reason, written=1)
    assert [value for *_, value in stored(data_dir, "t")] == [b"a"]


def test_a_null_timestamp_or_partition_is_left_out_on_the_fast_path_and_the_slow_one(
        capsys: pytest.CaptureFixture[str], data_dir: Path, produce: Produce) -> None:
    line = b'{"value": "a", "timestamp": null, "partition": null}\n'
    assert parse_chunk(line, LineFormat(json=True)).to_pylist() == [{"key": None, "value": b"a"}]
    create(capsys, data_dir, "t")
    # The bad second line sends the chunk down the slow path, which must take the first line as the fast one does.
    assert_refused(produce("t", line.decode() + '{"value": 5}\n', "--json"), 2, "'value' is 5", written=1)


@pytest.mark.parametrize(("line", "reason"), [
    ('{"key": "value"}', 'no "value" field'),  # the fast path took it for a tombstone of key "value"
    ('{"value": "a"}{"value": "b"}', "not JSON (Extra data"),  # the fast path read two messages
    ('{"value": "a", "value": "b"}', "the field 'value' is given twice"),  # was an AssertionError
])
def test_what_the_fast_json_path_took_otherwise_is_refused_as_the_slow_one_does(
        capsys: pytest.CaptureFixture[str], data_dir: Path, produce: Produce, line: str, reason: str) -> None:
    create(capsys, data_dir, "t")
    assert_refused(produce("t", f'{{"value": "ok"}}\n{line}\n', "--json"), 2, reason, written=1)


def test_a_refused_message_is_named_by_its_line_after_lines_with_and_without_a_partition(
        capsys: pytest.CaptureFixture[str], data_dir: Path, produce: Produce) -> None:
    create(capsys, data_dir, "t", "--partitions", "2", "--config", "max.message.bytes=100")
    lines = f'{{"value": "a", "partition": 1}}\n{{"value": "b"}}\n{{"value": "{"x" * 200}"}}\n{{"value": "c"}}\n'
    assert_refused(produce("t", lines, "--json"), 3, "the message is", written=2)
    assert {value for *_, value in stored(data_dir, "t")} == {b"a", b"b"}


def test_a_message_too_large_before_a_malformed_line_is_named_by_its_line(
        capsys: pytest.CaptureFixture[str], data_dir: Path, produce: Produce) -> None:
    """Both in one chunk: the store's refusal came out as "Message at row 1", with nothing of the chunk written."""
    create(capsys, data_dir, "t", "--config", "max.message.bytes=100")
    assert_refused(produce("t", f"k\t1\nk\t{'x' * 200}\nno separator\n"), 2, "the message is", written=1)
    assert [value for *_, value in stored(data_dir, "t")] == [b"1"]


def test_file_reads_pipes_and_fifos_and_refuses_a_directory(capsys: pytest.CaptureFixture[str], data_dir: Path,
                                                            tmp_path: Path) -> None:
    create(capsys, data_dir, "t")
    read_end, write_end = os.pipe()  # what a shell's <(echo a) hands over: /dev/fd/N
    os.write(write_end, b"a\t1\n")
    os.close(write_end)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=feed_fifo, args=(fifo, b"b\t2\n"))
    writer.start()
    try:
        result = run_main(capsys, data_dir, "produce", "t", "--file", f"/dev/fd/{read_end}", "--file", str(fifo))
    finally:
        os.close(read_end)
        writer.join()
    assert result.code == 0 and "Produced 2 messages" in result.err

    good = tmp_path / "good.tsv"
    good.write_text("c\t3\n")
    refused = run_main(capsys, data_dir, "produce", "t", "--file", str(good), "--file", str(tmp_path))
    assert refused.code == ExitCode.USAGE
    assert f"--file {tmp_path} is a directory" in refused.err and "Nothing was produced." in refused.err
    assert [value for *_, value in stored(data_dir, "t")] == [b"1", b"2"]


def feed_fifo(fifo: Path, data: bytes, timeout_s: float = 5.0) -> None:
    """Write ``data`` to ``fifo`` once a reader opens it; give up after ``timeout_s`` if none does (a plain open
    for writing would wait for ever, and the test with it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.01)
            continue
        try:
            os.write(descriptor, data)
        finally:
            os.close(descriptor)
        return


@pytest.mark.parametrize("count", ["0", "-3"])
def test_topics_create_refuses_fewer_than_one_partition_as_usage(capsys: pytest.CaptureFixture[str],
                                                                 data_dir: Path, count: str) -> None:
    result = run_main(capsys, data_dir, "topics", "create", "t", "--partitions", count)
    assert result.code == ExitCode.USAGE
    assert f"--partitions {count}: partitions must be an integer from 1 to 100,000, got {int(count)}." in result.err
    assert not data_dir.exists()


def test_topics_create_if_not_exists_says_how_many_partitions_the_topic_has(
        capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    create(capsys, data_dir, "t", "--partitions", "2")
    result = run_main(capsys, data_dir, "topics", "create", "t", "--if-not-exists", "--partitions", "5")
    assert result.code == 0
    assert "Topic t already exists, with 2 partition(s); nothing was changed." in result.err


def test_dump_log_refuses_a_data_folder_and_reads_an_empty_partition(capsys: pytest.CaptureFixture[str],
                                                                     data_dir: Path) -> None:
    create(capsys, data_dir, "t")
    refused = run_main(capsys, data_dir, "dump-log", str(data_dir))
    assert refused.code == ExitCode.USAGE
    assert f"{data_dir} holds no segment, index, ledger or layer record file" in refused.err
    assert f"such as a partition folder (in this data folder: {data_dir / 't-0'})" in refused.err
    assert run_main(capsys, data_dir, "dump-log", str(data_dir / "t-0")) == Completed(0, "", "")


def test_compact_shows_no_layers_for_a_partition_never_compacted(capsys: pytest.CaptureFixture[str],
                                                                 data_dir: Path) -> None:
    create(capsys, data_dir, "t")
    table = run_main(capsys, data_dir, "compact", "t").out.splitlines()
    row = dict(zip(table[0].split(), table[1].split(), strict=True))
    assert (row["ledger"], row["layers"], row["horizon"], row["skipped"]) == ("-", "-", "-1", "yes")
    [as_json] = run_main(capsys, data_dir, "compact", "t", "--json").json_lines()
    assert (as_json["ledger_id"], as_json["layers"]) == (None, 0)


def test_help_and_the_docs_list_the_same_exit_statuses() -> None:
    in_help = {int(status): " ".join(meaning.split()) for status, meaning in
               re.findall(r"^\s*(\d+)  (.*?)(?=^\s*\d+  |\Z)", EXIT_CODES_HELP, re.MULTILINE | re.DOTALL)}
    in_docs = {int(status): meaning.replace("`", "") for status, meaning in
               re.findall(r"^\| (\d+) \| (.*) \|$", DOCS.read_text(), re.MULTILINE)}
    assert set(in_help) == {int(code) for code in ExitCode}
    assert in_docs == in_help


def test_a_conflict_with_another_writers_work_exits_4_as_the_help_says() -> None:
    """A tier a data folder owns refuses writers of the tier alone, and a Spark compaction another one overtook
    drops its work: both conflicts, which exited 5 as failures."""
    from streaming.compaction import CompactionConflictError  # imports Spark

    assert exit_code_for(RemoteLogOwnedError("events", 0, 1)) is ExitCode.CONFLICT
    assert exit_code_for(CompactionConflictError("events", 0, 3, 4)) is ExitCode.CONFLICT


def test_options_that_mean_nothing_together_are_refused(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    create(capsys, data_dir, "t")
    task_bytes = run_main(capsys, data_dir, "compact", "t", "--task-bytes", "100")
    assert task_bytes.code == 2 and "takes --spark MASTER" in task_bytes.err
    both = run_main(capsys, data_dir, "topics", "alter", "t", "--config", "retention.ms=5",
                    "--delete-config", "retention.ms")
    assert both.code == 2 and "retention.ms: both set (--config) and deleted (--delete-config)" in both.err
    with Store.open(data_dir) as store:
        assert store.topic_metadata("t").overrides == {}


def test_describe_names_a_damaged_topic_and_still_describes_the_others(capsys: pytest.CaptureFixture[str],
                                                                      data_dir: Path) -> None:
    create(capsys, data_dir, "a")
    create(capsys, data_dir, "b")
    (data_dir / "__topics" / "a" / "topic.json").write_text("{not json")
    described = run_main(capsys, data_dir, "topics", "describe")
    assert described.code == 1 and "ledgerview: error: a: " in described.err
    assert "Topic: b\t" in described.out


def test_a_line_too_long_for_any_message_the_topic_takes_is_refused_before_it_is_read_whole(
        produce: Produce, capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    """A file without line ends was gathered into one line in memory, however large, before the store refused its
    message; the line is refused once it passes the longest line a message of max.message.bytes may need (as the
    service's directory source refuses it)."""
    create(capsys, data_dir, "t", "--config", "max.message.bytes=1000")
    chunk_bytes = 8 * 1024 * 1024  # one read of the input, and the least a line may be
    lines = "k1\tfirst\n" + "k2\t" + "x" * (3 * chunk_bytes) + "\nk3\tafter\n"
    assert_refused(produce("t", lines), 2, f"the line is longer than {chunk_bytes} bytes, the longest read for a "
                   "message of at most the topic's max.message.bytes=1000", written=1)
    assert [value for _, _, _, value in stored(data_dir, "t")] == [b"first"]


def test_describe_and_compaction_status_answer_for_a_topic_with_a_damaged_partition(
        capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    """One partition whose log does not open made 'topics describe' print only the error, and
    'compaction-status' fail, though the compaction status is a record of the partition's folder."""
    create(capsys, data_dir, "t", "--partitions", "2")
    with Store.open(data_dir) as store:
        for partition in range(2):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=partition)
    [segment] = (data_dir / "t-1").glob("*.log")
    flipped = bytearray(segment.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    segment.write_bytes(bytes(flipped))
    described = run_main(capsys, data_dir, "topics", "describe", "t")
    assert described.code == 1
    rows = [line.split() for line in described.out.splitlines()[2:]]
    assert rows == [["0", "0", "10", "1024", "1"], ["1", "-", "-", "-", "-"]]
    assert f"t-1: CorruptSegmentError: Corrupt batch in {segment}" in described.err
    status = run_main(capsys, data_dir, "compaction-status", "t", "--json")
    assert status.code == 0 and [row["state"] for row in status.json_lines()] == ["NOT_RUN", "NOT_RUN"]


@pytest.mark.parametrize("output", [[], ["--json"]])
def test_describe_names_a_damaged_partition_of_any_topic_and_describes_a_store_without_topics(
        capsys: pytest.CaptureFixture[str], data_dir: Path, output: list[str]) -> None:
    """The damaged partitions were named (and the exit status was 1) only for the last topic described, and a
    store without topics failed with UnboundLocalError."""
    create(capsys, data_dir, "gone")
    assert run_main(capsys, data_dir, "topics", "delete", "gone").code == 0
    empty = run_main(capsys, data_dir, "topics", "describe", *output)
    assert (empty.code, empty.out, empty.err) == (0, "", "")
    create(capsys, data_dir, "a")
    create(capsys, data_dir, "b")
    with Store.open(data_dir) as store:
        for topic in ("a", "b"):
            store.append(topic, [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
    [segment] = (data_dir / "a-0").glob("*.log")
    flipped = bytearray(segment.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    segment.write_bytes(bytes(flipped))
    described = run_main(capsys, data_dir, "topics", "describe", *output)
    assert described.code == 1
    assert f"ledgerview: error: a-0: CorruptSegmentError: Corrupt batch in {segment}" in described.err
    shown = [row["topic"] for row in described.json_lines()] if output else re.findall(r"^Topic: (\w+)\t",
                                                                                        described.out, re.MULTILINE)
    assert shown == ["a", "b"] and "b-0" not in described.err


def test_a_topic_whose_record_is_damaged_can_be_deleted(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    """'topics delete' of a topic whose topic.json is garbage failed with the record's error: the operator could
    neither use the topic nor get rid of it (nor create it again) but by hand."""
    create(capsys, data_dir, "a", "--partitions", "2")
    create(capsys, data_dir, "b")
    with Store.open(data_dir) as store:
        store.append("a", [(b"k", b"v")], partition=1)
    (data_dir / "__topics" / "a" / "topic.json").write_text("{not json")
    deleted = run_main(capsys, data_dir, "topics", "delete", "a")
    assert (deleted.code, deleted.err) == (0, "Deleted topic a.\n")
    assert not (data_dir / "a-0").exists() and not (data_dir / "a-1").exists()
    assert not (data_dir / "__topics" / "a").exists()
    assert run_main(capsys, data_dir, "topics", "list").out == "b\n"
    create(capsys, data_dir, "a")
