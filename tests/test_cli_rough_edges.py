"""What a newcomer met on the command line, mended: bytes that are not UTF-8 printed escaped, a refused message in
a large produce writing exactly the lines before it, bad separators and lone surrogates refused clearly, --data
before the command, --version, and compaction times people read. Invariant 10 (DESIGN.md): bad input gets a clear
error and loses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactor import Compactor
from storage import Store
from storage.compaction_status import STATUS_RECORD, STATUS_VERSION, status_path
from storage.records import decode_record, encode_record
from tests.cli_runner import run_cli

pytestmark = pytest.mark.slow  # subprocesses: the whole suite runs these, not the fast one


def test_bytes_that_are_not_utf8_are_printed_escaped_and_a_subscription_passes_them(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "t")
    with Store.open(data_dir) as store:
        store.append("t", [(b"\xff\xfek", b"v\x80"), ("ok", "fine")])
    printed = run_cli(data_dir, "consume", "t", "--from-beginning", "--until-end").out
    assert printed.splitlines() == ["\\xff\\xfek\tv\\x80", "ok\tfine"]


def test_a_refused_message_leaves_exactly_the_lines_before_it_written(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "t", "--config", "max.message.bytes=100")
    lines = "a\t1\n\nb\t2\n" + "big\t" + "x" * 200 + "\nc\t3\n"
    refused = run_cli(data_dir, "produce", "t", input=lines, check=False)
    assert refused.code != 0
    assert "stdin line 4: the message is" in refused.err
    assert "over the topic's max.message.bytes=100" in refused.err
    assert "2 messages before it were written, nothing from this line on" in refused.err
    printed = run_cli(data_dir, "consume", "t", "--from-beginning", "--until-end").out
    assert printed.splitlines() == ["a\t1", "b\t2"]


def test_an_empty_separator_and_a_lone_surrogate_are_refused_clearly(data_dir: Path, tmp_path: Path) -> None:
    run_cli(data_dir, "topics", "create", "t")
    empty = run_cli(data_dir, "produce", "t", "--separator", "", input="a\tb\n", check=False)
    assert empty.code == 2 and "the separator must be at least one character" in empty.err
    surrogate = tmp_path / "lines.jsonl"
    surrogate.write_text('{"key": "ok", "value": "1"}\n{"key": "\\ud800", "value": "x"}\n')
    refused = run_cli(data_dir, "produce", "t", "--json", "--file", str(surrogate), check=False)
    assert "line 2: 'key' holds a lone surrogate escape" in refused.err
    assert "Traceback" not in refused.err
    assert run_cli(data_dir, "consume", "t", "--from-beginning", "--until-end").out == "ok\t1\n"


def test_global_options_come_before_the_command_too(data_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    run_cli(data_dir, "--data", str(other), "topics", "create", "t")
    assert run_cli(data_dir, "--data", str(other), "topics", "list").out == "t\n"
    assert run_cli(data_dir, "topics", "list", "--data", str(other)).out == "t\n"
    assert run_cli(data_dir, "--version").out.startswith("ledgerview ")


def test_compaction_status_prints_times_people_read(data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "t")
    run_cli(data_dir, "produce", "t", input="a\t1\n")
    run_cli(data_dir, "compact", "t")
    table = run_cli(data_dir, "compaction-status", "t").out.splitlines()
    assert "started (UTC)" in table[0]
    assert table[1].split()[2].count("-") == 2  # a date, 2026-11-25, not epoch milliseconds


def test_verify_finds_a_topic_not_yet_written_sound_and_a_partition_whose_segments_vanished_not(
        data_dir: Path) -> None:
    run_cli(data_dir, "topics", "create", "fresh", "--partitions", "2")
    assert run_cli(data_dir, "verify").code == 0
    run_cli(data_dir, "produce", "fresh", "--partition", "1", input="a\t1\n")
    for segment in (data_dir / "fresh-1").glob("*.log"):
        segment.unlink()
    broken = run_cli(data_dir, "verify", check=False)
    assert broken.code != 0
    assert "fresh-1: no segment files, though the recovery-point checkpoint records messages up to offset 1" in (
        broken.out + broken.err)


@pytest.mark.parametrize("field, value, problem", [
    ("messages_read", "many", "messages_read 'many' is not an integer >= 0"),
    ("state", "DONE", "'DONE' is not a valid CompactionState"),
    ("ended_ms", -5, "ended_ms -5 is not None or an integer >= 0"),
])
def test_a_status_record_whose_checksum_holds_but_whose_fields_do_not_is_reported_as_damaged(
        data_dir: Path, field: str, value: object, problem: str) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [("a", "1")])
        Compactor(store).compact("t")
    path = status_path(data_dir / "t-0")
    _, body = decode_record(path, path.read_bytes(), STATUS_RECORD, max_version=STATUS_VERSION)
    path.write_bytes(encode_record(STATUS_RECORD, STATUS_VERSION, {**body, field: value}))
    shown = run_cli(data_dir, "compaction-status", "t", check=False)
    assert shown.code == 1 and "Traceback" not in shown.err
    assert f"compaction-status record {path} is damaged" in shown.err and problem in shown.err
