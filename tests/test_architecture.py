"""The dependency direction of DESIGN.md: ledgerview -> streaming, readers, compactor -> storage.

storage imports none of the others; readers reads compacted ledgers through storage, never through compactor;
compactor and readers know nothing of streaming or the shell. Within the shell, the Kafka endpoint runs on its own
(python -m ledgerview.kafka) and imports nothing of the service; what both use lives beside them in ledgerview/.
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


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}  # from a import b
    return modules


def imported_packages(path: Path) -> set[str]:
    return {module.split(".")[0] for module in imported_modules(path)}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_lies_below_it(package: str) -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {sorted(imported_packages(path) & FORBIDDEN[package])}"
        for path in (ROOT / package).rglob("*.py")
        if imported_packages(path) & FORBIDDEN[package]
    }
    assert not offenders


def test_the_kafka_endpoint_imports_nothing_of_the_service() -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {sorted(service)}"
        for path in (ROOT / "ledgerview" / "kafka").rglob("*.py")
        if (service := {module for module in imported_modules(path)
                        if module == "ledgerview.service" or module.startswith("ledgerview.service.")})
    }
    assert not offenders
