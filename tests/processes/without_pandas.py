"""Run a helper script of this folder with pandas hidden, as the store runs where only its dependencies are.

Usage: python without_pandas.py SCRIPT ARGS...

pandas is only a development dependency of ledgerview (see pyproject.toml), but when it is installed pyarrow
imports it on the first table a process builds, which costs a child process about half a second before its first
append. The fault tests start dozens of children, so they hide pandas; the store itself never uses it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


class _HidePandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _HidePandas())
    script = Path(__file__).resolve().parent / sys.argv[1]
    sys.argv = [str(script), *sys.argv[2:]]
    runpy.run_path(str(script), run_name="__main__")
