"""The dependency direction of DESIGN.md: ledgerview -> streaming, readers, compactor -> storage.

storage imports none of the others; readers reads compacted ledgers through storage, never through compactor;
compactor and readers know nothing of streaming or the shell.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "storage": {"compactor", "readers", "streaming", "ledgerview"},
    "compactor": {"readers", "streaming", "ledgerview"},
    "readers": {"compactor", "streaming", "ledgerview"},
    "streaming": {"ledgerview"},
}


def imported_packages(path: Path) -> set[str]:
    packages = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            packages |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_lies_below_it(package: str) -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {sorted(imported_packages(path) & FORBIDDEN[package])}"
        for path in (ROOT / package).rglob("*.py")
        if imported_packages(path) & FORBIDDEN[package]
    }
    assert not offenders
