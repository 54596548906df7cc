"""The demo empties its data folder first: it must never empty a folder it did not make (invariant 10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_the_demo_refuses_a_folder_it_did_not_make_and_leaves_it_alone(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    result = subprocess.run([sys.executable, "-m", "ledgerview.cli", "demo", "--data", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{tmp_path} is not empty and was not made by the demo" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert precious.read_text() == "keep me"
