"""``ledgerview consume`` as a pipeline's first command: a subscription acknowledges only what reached the reader,
and a start time without a zone is UTC whatever the machine's zone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from readers import Consumer
from storage import Store
from tests.cli_runner import run_cli, run_main

MESSAGES = 100_000
"""Far more than a pipe holds (64 KiB), in one batch."""


@pytest.mark.slow
def test_a_subscription_acknowledges_nothing_the_closed_pipe_did_not_take(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("p")
        store.append("p", [(b"k%d" % number, b"v%d" % number) for number in range(MESSAGES)], partition=0)
    consume = subprocess.Popen([sys.executable, "-m", "ledgerview", "consume", "p", "--subscription", "s",
                                "--from-beginning", "--until-end"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "LEDGERVIEW_DATA": str(data_dir)})
    assert consume.stdout is not None and consume.stderr is not None
    assert consume.stdout.readline() == b"k0\tv0\n"
    consume.stdout.close()  # as `| head -1` exits
    assert consume.wait(timeout=60) == 0
    consume.stderr.close()
    with Store.open(data_dir) as store, Consumer(store, "p", "s") as consumer:
        assert consumer.acknowledged == {0: 0}
    assert run_cli(data_dir, "consume", "p", "--subscription", "s", "--until-end").out.startswith("k0\tv0\n")


def test_a_start_time_without_a_zone_is_utc(data_dir: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [{"key": b"before", "value": b"1", "timestamp": 1_763_805_599_999},
                           {"key": b"at", "value": b"2", "timestamp": 1_763_805_600_000}], partition=0)
    # 2025-11-22T10:00:00Z is 1_763_805_600_000 ms
    for start in ("2025-11-22T10:00:00", "2025-11-22T10:00:00+00:00", "1763805600000"):
        result = run_main(capsys, data_dir, "consume", "t", "--timestamp", start, "--until-end")
        assert (result.code, result.out) == (0, "at\t2\n"), start
    refused = run_main(capsys, data_dir, "consume", "t", "--timestamp", "-5", "--until-end")
    assert refused.code == 2 and "milliseconds since the epoch (>= 0)" in refused.err


def test_a_negative_offset_is_refused_in_the_commands_terms(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("t")
    refused = run_main(capsys, data_dir, "consume", "t", "--partition", "0", "--offset", "-1", "--until-end")
    assert (refused.code, refused.err.strip()) == (2, "ledgerview: error: --offset must be >= 0, got -1.")


@pytest.mark.parametrize("option", ["--max-messages", "--timeout-ms", "--offset"])
def test_a_count_past_64_bits_is_refused_in_the_commands_terms(data_dir: Path, option: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """--max-messages 99999999999999999999 ended in an OverflowError traceback from pyarrow's slice."""
    with Store.open(data_dir) as store:
        store.create_topic("t")
        store.append("t", [(b"k", b"v")], partition=0)
    start = [] if option == "--offset" else ["--from-beginning"]
    refused = run_main(capsys, data_dir, "consume", "t", "--partition", "0", *start, option, "99999999999999999999",
                       "--until-end")
    assert (refused.code, refused.err.strip()) == (2, f"ledgerview: error: {option} must be at most "
                                                      "9223372036854775807 (a 64-bit count), got 99999999999999999999.")
