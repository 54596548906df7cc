"""Running the ``ledgerview`` command line as a real subprocess, as a user or a script would; or, for the fast
suite, its entry point ``ledgerview.cli.main`` in this process (the same parsing, error lines and exit statuses,
without a second or so of interpreter start per command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TIMEOUT_S = 120
"""How long a command may run before the test fails: a guard against hangs, not a timing."""
SPARK_TIMEOUT_S = 600
"""The same for a command that runs Spark (the demo): a JVM's start and a streaming query, on a machine the other
test workers' Spark also uses."""


@dataclass(frozen=True)
class Completed:
    code: int
    out: str
    err: str

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line]


def run_cli(data: Path, *args: str, input: str | bytes | None = None, check: bool = True,
            timeout_s: float = TIMEOUT_S) -> Completed:
    """``python -m ledgerview ARGS`` with LEDGERVIEW_DATA set to ``data``; with ``check``, a non-zero exit fails."""
    payload = input.encode() if isinstance(input, str) else input
    env = {**os.environ, "LEDGERVIEW_DATA": str(data)}
    result = subprocess.run([sys.executable, "-m", "ledgerview", *args], input=payload, capture_output=True,
                            env=env, timeout=timeout_s)
    completed = Completed(result.returncode, result.stdout.decode(), result.stderr.decode())
    if check and completed.code != 0:
        raise AssertionError(f"ledgerview {' '.join(args)} exited {completed.code}: {completed.err}")
    return completed


def run_main(capsys: pytest.CaptureFixture[str], data: Path, *args: str) -> Completed:
    """``ledgerview --data DATA ARGS`` through ``ledgerview.cli.main`` in this process, its output captured."""
    from ledgerview.cli import main

    capsys.readouterr()
    code = main(["--data", str(data), *args])
    out, err = capsys.readouterr()
    return Completed(code, out, err)
