"""What a bug bash of the operator tools (dump-log, verify, topics, retention, clean, groups) on damaged and odd
data found, mended: each case fails on the code before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import Store
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

