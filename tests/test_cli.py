"""The command line end to end: each command through a real ``python -m ledgerview`` subprocess on a temporary
store, with its output, its exit status and its one-line error for bad input (ledgerview/exit_codes.py).
Invariants (DESIGN.md): 2 (offsets never change through produce, compact, retention), 4 (the compacted view a
consumer prints), 10 (bad input is refused with a clear error and nothing stored is lost)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

from ledgerview.cli import COMMAND_MODULES, build_parser
from storage import Store
from tests.cli_runner import run_cli, run_main

TINY = ["--config", "segment.bytes=2048", "--config", "index.interval.bytes=256"]


def slow(*case: object) -> Any:
    """A parametrised case that only the whole suite runs (each costs a subprocess)."""
    return pytest.param(*case, marks=pytest.mark.slow)


def lines(text: str) -> list[str]:
    return text.splitlines()


def produce_keys(data: Path, topic: str, count: int, keys: int = 10, *extra: str) -> None:
    text = "".join(f"k{i % keys}\tv{i}\n" for i in range(count))
    run_cli(data, "produce", topic, *extra, input=text)


@pytest.mark.slow
def test_topics_create_list_describe_alter_delete(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices", "--partitions", "3", "--config", "retention.ms=3600000")
    run_cli(data_dir, "topics", "create", "users")
    assert lines(run_cli(data_dir, "topics", "list").out) == ["prices", "users"]

    run_cli(data_dir, "topics", "alter", "prices", "--config", "cleanup.policy=compact", "--delete-config",
            "retention.ms")
    described = run_cli(data_dir, "topics", "describe", "prices", "--json").json_lines()
    assert described[0]["config"] == {"cleanup.policy": "compact"}
    assert [p["partition"] for p in described[0]["partitions"]] == [0, 1, 2]
    assert all(p["end_offset"] == 0 for p in described[0]["partitions"])

    text = run_cli(data_dir, "topics", "describe").out
    assert "Topic: prices\tPartitionCount: 3\tConfigs: cleanup.policy=compact" in text
    assert "Topic: users\tPartitionCount: 1" in text

    run_cli(data_dir, "topics", "delete", "users")
    assert lines(run_cli(data_dir, "topics", "list").out) == ["prices"]


@pytest.fixture(scope="module")
def one_topic_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("bad-input") / "data"
    run_cli(data, "topics", "create", "prices")
    return data


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
@pytest.mark.parametrize(("args", "code", "message"), [
    (["topics", "create", "prices"], 4, "Topic 'prices' already exists"),
    slow(["topics", "create", "t2", "--config", "retention.msx=1"], 2, "Did you mean 'retention.ms'?"),
    (["topics", "describe", "nope"], 3, "Unknown topic 'nope'. Topics in this store: prices."),
    slow(["consume", "prices", "--offset", "3"], 2, "--offset needs exactly one --partition"),
    slow(["topics", "create", "t2", "--config", "cleanup.policy=shred"], 2,
         "Invalid value 'shred' for topic config 'cleanup.policy'"),
    slow(["topics", "create", "t2", "--config", "retention.ms"], 2, "is not key=value"),
    slow(["topics", "create", "a/b"], 2, "Invalid topic name 'a/b'"),
    slow(["topics", "alter", "prices"], 2, "Nothing to alter"),
    slow(["topics", "delete", "nope"], 3, "Unknown topic 'nope'"),
    slow(["produce", "nope"], 3, "Unknown topic 'nope'"),
    slow(["consume", "nope", "--until-end"], 3, "Unknown topic 'nope'"),
    slow(["consume", "prices", "--partition", "7", "--until-end"], 3, "has no partition 7"),
    slow(["produce", "prices", "--partition", "7", "--file", "/dev/null"], 3, "has no partition 7"),
    slow(["compact", "nope"], 3, "Unknown topic 'nope'"),
    slow(["produce", "prices", "--file", "missing.txt"], 3, "missing.txt"),
])
def test_bad_input_gets_one_line_error_and_exit_status(one_topic_store: Path, args: list[str], code: int,
                                                       message: str) -> None:
    result = run_cli(one_topic_store, *args, check=False)
    assert (result.code, result.out) == (code, "")
    assert len(lines(result.err)) == 1 and result.err.startswith("ledgerview: error: ")
    assert message in result.err


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_bad_input_changed_nothing(one_topic_store: Path) -> None:
    """Runs after the bad-input cases on the same store (pytest keeps file order)."""
    assert lines(run_cli(one_topic_store, "topics", "list").out) == ["prices"]
    assert run_cli(one_topic_store, "consume", "prices", "--from-beginning", "--until-end").out == ""


@pytest.mark.parametrize("args", [["a/b"], ["t", "--config", "cleanup.policy=shred"], ["t", "--partitions", "0"],
                                  ["t", "--partitions", "100001"]],
                         ids=["bad name", "bad config", "no partitions", "too many partitions"])
def test_a_refused_topic_creation_makes_no_data_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       args: list[str]) -> None:
    """A typo in the first command of a new store left an empty store behind, which later commands then took for
    the store."""
    result = run_main(capsys, tmp_path / "data", "topics", "create", *args)
    assert result.code == 2 and "ledgerview: error: " in result.err
    assert not (tmp_path / "data").exists()


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_a_missing_data_folder_is_not_created_by_a_reading_command(tmp_path: Path) -> None:
    result = run_cli(tmp_path / "typo", "topics", "list", check=False)
    assert result.code == 2 and "No data folder at" in result.err
    assert not (tmp_path / "typo").exists()


@pytest.mark.slow
def test_produce_text_and_consume_both_views(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices", "--partitions", "2", *TINY)
    text = "".join(f"SYM{i % 5}\t{100 + i}\n" for i in range(50)) + "SYM3\t-\n"
    result = run_cli(data_dir, "produce", "prices", "--null-marker", "-", input=text)
    assert "Produced 51 messages to prices." in result.err

    raw = lines(run_cli(data_dir, "consume", "prices", "--from-beginning", "--until-end", "--print-partition",
                        "--print-offset").out)
    assert len(raw) == 51
    assert sorted(line.split("\t")[3] for line in raw if line.split("\t")[2] == "SYM3") == [
        *(str(100 + i) for i in range(3, 50, 5)), "null"]
    partition_offsets: dict[str, list[int]] = {}
    for line in raw:
        partition, offset, *_ = line.split("\t")
        partition_offsets.setdefault(partition, []).append(int(offset))
    assert all(offsets == list(range(len(offsets))) for offsets in partition_offsets.values())

    run_cli(data_dir, "compact", "prices")
    compacted = lines(run_cli(data_dir, "consume", "prices", "--read-compacted", "--from-beginning",
                              "--until-end").out)
    assert sorted(compacted) == [f"SYM{k}\t{145 + k}" for k in (0, 1, 2, 4)]


@pytest.mark.slow
def test_produce_json_lines_with_timestamps_and_tombstones(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "users")
    records = [{"key": f"u{i}", "value": f"name{i}", "timestamp": 1_000 + i} for i in range(6)]
    records.append({"key": "u2", "value": None, "timestamp": 2_000})
    run_cli(data_dir, "produce", "users", "--json", input="".join(json.dumps(r) + "\n" for r in records))

    out = run_cli(data_dir, "consume", "users", "--timestamp", "1004", "--until-end", "--format", "json")
    assert [(m["offset"], m["key"], m["value"], m["timestamp"]) for m in out.json_lines()] == [
        (4, "u4", "name4", 1004), (5, "u5", "name5", 1005), (6, "u2", None, 2000)]


@pytest.mark.slow  # four CLI processes
def test_a_malformed_line_stops_produce_after_the_lines_before_it(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices")
    result = run_cli(data_dir, "produce", "prices", input="a\t1\n\nb\t2\nno separator here\nc\t3\n", check=False)
    assert result.code == 2
    assert "stdin line 4: no separator '\\t' between key and value: 'no separator here'" in result.err
    assert "2 messages before it were written" in result.err
    assert lines(run_cli(data_dir, "consume", "prices", "--from-beginning", "--until-end").out) == ["a\t1", "b\t2"]

    bad_json = run_cli(data_dir, "produce", "prices", "--json", input='{"key": "k", "value": 5}\n', check=False)
    assert bad_json.code == 2 and "stdin line 1: 'value' is 5; expected a string or null" in bad_json.err


@pytest.mark.slow
def test_consume_from_an_offset_and_through_a_durable_subscription(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "events")
    produce_keys(data_dir, "events", 10)
    from_offset = run_cli(data_dir, "consume", "events", "--partition", "0", "--offset", "7", "--until-end")
    assert lines(from_offset.out) == ["k7\tv7", "k8\tv8", "k9\tv9"]

    first = run_cli(data_dir, "consume", "events", "--subscription", "audit", "--from-beginning",
                    "--max-messages", "4", "--no-key")
    second = run_cli(data_dir, "consume", "events", "--subscription", "audit", "--max-messages", "4", "--no-key")
    assert lines(first.out) == ["v0", "v1", "v2", "v3"]
    assert lines(second.out) == ["v4", "v5", "v6", "v7"]
    latest = run_cli(data_dir, "consume", "events", "--until-end")
    assert latest.out == ""
    waited = run_cli(data_dir, "consume", "events", "--from-beginning", "--timeout-ms", "300", "--no-key")
    assert lines(waited.out) == [f"v{i}" for i in range(10)]


@pytest.mark.slow
def test_compaction_status_in_pulsar_states(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices", "--partitions", "2")
    before = run_cli(data_dir, "compaction-status", "prices", "--json").json_lines()
    assert [s["state"] for s in before] == ["NOT_RUN", "NOT_RUN"]
    produce_keys(data_dir, "prices", 40, 8)
    compacted = run_cli(data_dir, "compact", "prices", "--json").json_lines()
    assert sum(r["messages_kept"] for r in compacted) == 8
    assert sum(r["messages_read"] for r in compacted) == 40
    after = run_cli(data_dir, "compaction-status", "prices", "--wait")
    assert after.code == 0 and after.out.count("SUCCESS") == 2
    produce_keys(data_dir, "prices", 1, 8)  # one key replaced: its partition gets a ledger over the first
    again = run_cli(data_dir, "compact", "prices", "--json").json_lines()
    assert sorted((r["layers"], r["skipped"]) for r in again) == [(1, True), (2, False)]


@pytest.mark.slow
def test_retention_and_delete_records(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "logs", *TINY, "--config", "retention.ms=60000")
    old = "".join(json.dumps({"key": f"k{i}", "value": "x" * 100, "timestamp": 1_000 + i}) + "\n" for i in range(60))
    run_cli(data_dir, "produce", "logs", "--json", input=old)
    deleted = run_cli(data_dir, "retention", "logs", "--json").json_lines()
    assert deleted and all(d["reason"] == "retention.ms" for d in deleted)
    assert deleted[0]["base_offset"] == 0
    start = run_cli(data_dir, "topics", "describe", "logs", "--json").json_lines()[0]["partitions"][0]
    assert start["start_offset"] == start["end_offset"] == 60

    run_cli(data_dir, "topics", "create", "audit")
    produce_keys(data_dir, "audit", 20)
    moved = run_cli(data_dir, "delete-records", "audit", "--partition", "0", "--before-offset", "15", "--json")
    assert moved.json_lines()[0]["log_start_offset"] == 15
    assert len(lines(run_cli(data_dir, "consume", "audit", "--from-beginning", "--until-end").out)) == 5
    beyond = run_cli(data_dir, "delete-records", "audit", "--partition", "0", "--before-offset", "99", check=False)
    assert beyond.code == 2 and "from the log start offset 15 to the end offset 20" in beyond.err

    run_cli(data_dir, "topics", "create", "table", "--config", "cleanup.policy=compact")
    refused = run_cli(data_dir, "delete-records", "table", "--partition", "0", "--before-offset", "0", check=False)
    assert refused.code == 4 and "Set cleanup.policy=compact,delete" in refused.err


@pytest.mark.slow
def test_clean_keeps_the_latest_value_per_key_in_place(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("users", config={"cleanup.policy": "compact", "segment.bytes": "1024",
                                            "min.cleanable.dirty.ratio": "0.01"})
        for round_number in range(8):
            store.append("users", [(f"u{i}", f"r{round_number}") for i in range(6)])
        end_offset = store.end_offset("users", 0)
    cleaned = run_cli(data_dir, "clean", "--json")
    passes = cleaned.json_lines()
    assert len(passes) == 1 and passes[0]["topic"] == "users" and passes[0]["messages_written"] < 48
    after = lines(run_cli(data_dir, "consume", "users", "--from-beginning", "--until-end", "--print-offset").out)
    latest = {line.split("\t")[1]: line.split("\t")[2] for line in after}
    assert latest == {f"u{i}": "r7" for i in range(6)}
    offsets = [int(line.split("\t")[0]) for line in after]
    assert offsets == sorted(offsets) and offsets[-1] == end_offset - 1 and len(offsets) < 48
    assert run_cli(data_dir, "verify").code == 0

    run_cli(data_dir, "topics", "create", "logs")
    refused = run_cli(data_dir, "clean", "logs", check=False)
    assert refused.code == 2 and "set cleanup.policy=compact or compact,delete first" in refused.err


@pytest.mark.slow
def test_dump_log_prints_batches_crcs_and_messages(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices")
    produce_keys(data_dir, "prices", 5, 2)
    run_cli(data_dir, "produce", "prices", "--null-marker", "NULL", input="k0\tNULL\n")
    run_cli(data_dir, "compact", "prices")
    folder = data_dir / "prices-0"
    dump = run_cli(data_dir, "dump-log", str(folder / "00000000000000000000.log"), "--print-data-log").out
    assert "baseOffset: 0 lastOffset: 4 count: 5 position: 0 CreateTime:" in dump
    assert "isValid: true" in dump
    assert "| offset: 3 " in dump and "key: k1 payload: v3" in dump
    assert "| offset: 5 " in dump and "valueSize: -1 key: k0 payload: null" in dump
    ledger = run_cli(data_dir, "dump-log", str(folder / "compacted"), "--print-data-log").out
    assert "key: k1 payload: v3" in ledger and "k0" not in ledger
    assert "no ledger beneath: a view of one ledger" in ledger
    produce_keys(data_dir, "prices", 1, 2)  # k0 again: a ledger over the first, replacing none of its rows
    run_cli(data_dir, "produce", "prices", "--null-marker", "NULL", input="k1\tNULL\n")  # deletes k1's row
    run_cli(data_dir, "compact", "prices")
    layers = run_cli(data_dir, "dump-log", str(folder / "compacted" / f"{2:020d}.layers")).out
    assert "ledger: 1 horizon: 5 rows: 1 deleted: 1" in layers
    not_a_log = run_cli(data_dir, "dump-log", str(folder / "compacted" / "cursor.json"), check=False)
    assert not_a_log.code == 2 and "not a segment, index, ledger or layer record file" in not_a_log.err


@pytest.mark.slow
def test_verify_answers_with_its_exit_status(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices", *TINY)
    for _ in range(3):
        produce_keys(data_dir, "prices", 40, 8)
    run_cli(data_dir, "compact", "prices")
    sound = run_cli(data_dir, "verify", "--json").json_lines()[0]
    assert sound["sound"] and sound["segments"] >= 3 and sound["ledgers"] == 1 and not sound["warnings"]

    active = sorted((data_dir / "prices-0").glob("*.log"))[-1]
    with active.open("ab") as file:
        file.write(b"\x00" * 20)  # what a writer killed mid-append leaves
    torn = run_cli(data_dir, "verify")
    assert torn.code == 0 and "warning" in torn.out and "torn tail" in torn.out

    sealed = sorted((data_dir / "prices-0").glob("*.log"))[0]
    with sealed.open("r+b") as file:
        file.seek(200)
        file.write(b"\xff\xfe\xfd")
    damaged = run_cli(data_dir, "verify", check=False)
    assert damaged.code == 1
    assert f"PROBLEM {sealed}: batch at position 0" in damaged.out and "CRC-32C mismatch" in damaged.out
    assert "NOT SOUND (1 problems)" in damaged.err


@pytest.mark.slow
def test_verify_finds_an_index_entry_that_points_at_the_wrong_batch(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("prices", config={"segment.bytes": "4096", "index.interval.bytes": "64"})
        for round_number in range(10):
            store.append("prices", [(f"k{i}", f"v{round_number}") for i in range(5)])
    index = sorted((data_dir / "prices-0").glob("*.index"))[0]
    entries = index.read_bytes()
    assert len(entries) >= 16, "the tiny config indexes several batches"
    index.write_bytes(entries[:4] + entries[12:16] + entries[8:])  # entry 0 names entry 1's position
    damaged = run_cli(data_dir, "verify", check=False)
    assert damaged.code == 1
    assert f"PROBLEM {index}: entry 0" in damaged.out and "does not point at the batch" in damaged.out


@pytest.mark.slow
def test_a_progress_bar_only_on_a_terminal(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "prices", *TINY)
    produce_keys(data_dir, "prices", 300, 8)
    piped = run_cli(data_dir, "verify")
    assert "verifying" not in piped.err and "\r" not in piped.err
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    environment = {**os.environ, "LEDGERVIEW_DATA": str(data_dir), "LEDGERVIEW_PROGRESS_DELAY_S": "0"}
    try:
        result = subprocess.run([sys.executable, "-m", "ledgerview", "verify"], stdout=subprocess.PIPE,
                                stderr=terminal, timeout=120, env=environment)
        os.close(terminal)
        shown = b""
        while chunk := _read_available(controller):
            shown += chunk
    finally:
        os.close(controller)
    assert result.returncode == 0 and b"\rverifying:   0%|" in shown and b"sound" in shown


def _read_available(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal's other end is closed: everything was read
        return b""


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_help_is_the_reference() -> None:
    top = run_cli(Path("unused"), "--help")
    for command in ("topics", "produce", "consume", "compact", "compaction-status", "clean", "retention",
                    "delete-records", "remote", "dump-log", "verify", "serve", "demo"):
        assert command in top.out
    assert "exit statuses:" in top.out and "130  interrupted" in top.out
    assert "--remote URI" in top.out


def test_each_command_is_registered_by_the_module_named_for_it() -> None:
    """A command parsed from a command line registers its module alone: a wrong entry in COMMAND_MODULES would
    leave it unknown there, though ``--help`` lists it."""
    everything = build_parser([])
    assert set(_choices(everything)) == set(COMMAND_MODULES)
    for command in COMMAND_MODULES:
        assert command in _choices(build_parser(["--data", "topics", command, "--help"]))
    assert set(_choices(build_parser(["-h", "produce"]))) == set(COMMAND_MODULES)  # help before it lists them all


@pytest.mark.parametrize("abbreviated", ["--dat", "--rem"])
def test_an_abbreviated_store_option_before_the_command_is_refused(
        abbreviated: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would take ``--dat DIR`` for ``--data DIR``, while ``_command_named`` reads the options before the
    command whole and so would take DIR for a command word (``--dat produce topics list`` registered ``produce``
    alone, then failed on ``topics``). Refused, the error names the option the user mistyped."""
    argv = [abbreviated, "produce", "topics", "list"]
    with pytest.raises(SystemExit) as refused:
        build_parser(argv).parse_args(argv)
    assert refused.value.code == 2
    assert f"unrecognized arguments: {abbreviated} list" in capsys.readouterr().err


def _choices(parser: Any) -> list[str]:
    [commands] = [action for action in parser._actions if action.dest == "command"]
    return list(commands.choices)


@pytest.mark.slow  # a Python process of its own
def test_a_store_command_starts_without_the_kafka_endpoint_the_service_or_spark(data_dir: Path) -> None:
    """Every command imported every command module, and with them the Kafka endpoint (kafka-python's protocol
    classes), the service and Spark: seconds of start-up for each ``topics list``."""
    script = ("import sys; from ledgerview.cli import main; main(sys.argv[1:]); "
              "print(sorted({name.split('.')[0] + '.' + name.split('.')[1] if name.startswith('ledgerview.') else "
              "name.split('.')[0] for name in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", script, "--data", str(data_dir), "topics", "create", "t"],
                          capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1].replace("'", '"')))
    assert {"storage", "ledgerview.commands"} <= loaded
    assert not loaded & {"kafka", "ledgerview.kafka", "ledgerview.service", "pyspark", "streaming"}


@pytest.mark.parametrize("command", [["topics", "create"], ["produce"], ["consume"], ["compact"],
                                     ["compaction-status"], ["clean"], ["retention"], ["delete-records"], ["dump-log"],
                                     ["verify"], ["remote", "sync"], ["remote", "status"], ["remote", "claim"]])
def test_every_command_has_help_with_its_options(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser([*command, "--help"]).parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert ("--data" in shown and "--remote URI" in shown) or command == ["dump-log"]
