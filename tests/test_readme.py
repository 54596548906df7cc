"""The README's command-line block runs as written, in order, in a fresh folder: a newcomer's first commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # subprocesses: the whole suite runs these, not the fast one


def test_the_command_line_block_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The command line and the service"):]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    environment.pop("LEDGERVIEW_DATA", None)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.group(1)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("sound")
