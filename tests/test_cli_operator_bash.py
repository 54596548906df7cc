"""What a bug bash of the operator tools (dump-log, verify, topics, retention, clean, groups) on damaged and odd
data found, mended: each case fails on the code before its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage import Store
from storage.verification import verify_topics
from tests.cli_runner import run_main


def test_verify_names_a_garbage_checkpoint_and_still_checks_every_topic(data_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A recovery-point checkpoint of garbage stopped verify before its first topic: one error line, no report
    (with --json no JSON), and the damage elsewhere unchecked."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        for _ in range(3):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
    damaged = sorted((data_dir / "t-0").glob("*.log"))[0]
    flipped = bytearray(damaged.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    (data_dir / "recovery-point-offset-checkpoint").write_text("garbage\n")
    verified = run_main(capsys, data_dir, "verify", "--json")
    assert verified.code == 1
    [report] = verified.json_lines()
    assert report["sound"] is False and report["segments"] >= 2
    problems = report["problems"]
    assert any("recovery-point-offset-checkpoint is malformed" in problem for problem in problems), problems
    assert any(problem.startswith(f"{damaged}: ") for problem in problems), problems


@pytest.mark.parametrize("loss", ["removed", "emptied"])
def test_verify_finds_the_offsets_of_a_segment_lost_between_two_others(data_dir: Path, loss: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A segment file gone from the middle of a partition (removed by hand, a restore that missed it) or emptied:
    verify said the store was sound, while reads skip its offsets without a word."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        for _ in range(4):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
    logs = sorted((data_dir / "t-0").glob("*.log"))
    assert len(logs) >= 3
    if loss == "removed":
        for suffix in (".log", ".index", ".timeindex"):
            logs[1].with_suffix(suffix).unlink()
    else:
        logs[1].write_bytes(b"")
    base = int(logs[1].stem)
    verified = run_main(capsys, data_dir, "verify")
    assert verified.code == 1
    assert (f"PROBLEM {logs[2]}: starts at offset {int(logs[2].stem)}, but the segment before it ends at "
            f"{base}: offsets {base} to {int(logs[2].stem) - 1} are in no "
            "segment") in verified.out
    assert "NOT SOUND" in verified.err


def test_clean_names_a_topic_whose_record_is_damaged_and_still_cleans_the_others(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One topic.json of garbage stopped 'clean' (every compact topic) before it cleaned any topic."""
    config = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01"}
    with Store.open(data_dir) as store:
        for topic in ("a", "b"):
            store.create_topic(topic, config=config)
            for round_number in range(8):
                store.append(topic, [(f"u{i}", f"r{round_number}") for i in range(6)])
    (data_dir / "__topics" / "a" / "topic.json").write_text("{not json")
    unreadable = f"ledgerview: error: a was not cleaned: Topic metadata {data_dir / '__topics' / 'a' / 'topic.json'} " \
                 "is unreadable"
    cleaned = run_main(capsys, data_dir, "clean", "--json")
    assert cleaned.code == 1
    assert [row["topic"] for row in cleaned.json_lines()] == ["b"]
    assert unreadable in cleaned.err
    named = run_main(capsys, data_dir, "clean", "a", "b", "--json")  # named, as docs/cli.md says too
    assert named.code == 1 and unreadable in named.err


SWEEP = """
import contextlib, io, sys
from pathlib import Path
from ledgerview.cli import main
source, target = Path(sys.argv[1]), Path(sys.argv[2])
data = source.read_bytes()
refused = 0
for position in range(48, len(data)):  # every byte after the header
    flipped = bytearray(data)
    flipped[position] ^= 0xFF
    target.write_bytes(bytes(flipped))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["dump-log", str(target), "--print-data-log"]) == 0, position
    refused += "| payload does not decode: " in out.getvalue()
print("swept", len(data) - 48, "refused", refused)
"""


@pytest.mark.slow
def test_dump_log_prints_the_messages_of_a_damaged_batch_without_reading_outside_it(data_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """dump-log --print-data-log decoded a batch whose CRC fails as if it were sound: a flipped byte among the
    payload's offsets had Arrow read outside the file, and the process died of a segmentation fault (status -11).
    Every byte of a batch is flipped in turn, in one process of its own."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [(b"k", b"%d" % number) for number in range(1, 11)], partition=0)
    [segment] = (data_dir / "t-0").glob("*.log")
    swept = subprocess.run([sys.executable, "-c", SWEEP, str(segment), str(tmp_path / "flipped.log")],
                           capture_output=True, text=True, timeout=300)
    assert swept.returncode == 0, swept.stderr[-2000:]
    words = swept.stdout.split()
    assert words[:3] == ["swept", str(segment.stat().st_size - 48), "refused"] and int(words[3]) > 0, swept.stdout


def test_verify_lists_a_partition_again_when_a_segment_goes_while_it_is_checked(data_dir: Path) -> None:
    """Retention, delete-records or a cleaner's swap in another process (a running service does them on its own)
    that removed a segment verify had listed but not read yet made verify fail with 'No such file or directory'
    (exit status 3, the status of an unknown topic)."""
    config = {"segment.bytes": "1024", "cleanup.policy": "delete", "file.delete.delay.ms": "0"}
    with Store.open(data_dir) as store:
        store.create_topic("t", config=config)
        for _ in range(6):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=0)
    bases = sorted(int(path.stem) for path in (data_dir / "t-0").glob("*.log"))
    assert len(bases) >= 4
    deleted = []
    progress = []

    def advance(size_bytes: int) -> None:  # after the first segment, another process deletes the next two
        progress.append(size_bytes)
        if not deleted:
            with Store.open(data_dir) as other:
                deleted.append(other.delete_records("t", 0, bases[3]))

    with Store.open(data_dir, read_only=True) as store:
        report = verify_topics(store, ["t"], advance)
    assert deleted and len(deleted[0].deleted) == 3
    assert report.sound, report.problems
    assert report.segments == len(bases) - 3
    assert sum(progress) == report.bytes_checked  # the segment checked before the listing changed counts once


def test_dump_log_prints_the_whole_entries_of_an_index_with_a_torn_end(data_dir: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An index whose size is not a whole number of entries (a torn write) printed only that it was not, hiding
    every entry before its torn end."""
    with Store.open(data_dir) as store:
        store.create_topic("t", config={"index.interval.bytes": "64"})
        for _ in range(4):
            store.append("t", [(b"k%d" % i, b"v" * 20) for i in range(3)], partition=0)
    index = data_dir / "t-0" / "00000000000000000000.index"
    whole = run_main(capsys, data_dir, "dump-log", str(index))
    entries = whole.out.splitlines()[1:]
    assert len(entries) == 3 and all(line.startswith("offset: ") for line in entries)
    with index.open("ab") as file:
        file.write(b"\x01\x02\x03")
    torn = run_main(capsys, data_dir, "dump-log", str(index))
    assert torn.code == 0
    assert torn.out.splitlines()[1:] == [*entries, "Not a whole number of 8-byte entries: 27 bytes, the 3 after the 3 "
                                                   "whole entries ignored"]
