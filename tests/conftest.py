"""Shared fixtures: a fresh data folder, a store on it with an injected clock, and the tiny-config preset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from storage import Store

settings.register_profile("ci", max_examples=40, deadline=None)
settings.register_profile("thorough", max_examples=400, deadline=None)
settings.load_profile("ci")

TINY = {"segment.bytes": "2048", "index.interval.bytes": "256"}
"""Small segments and a dense index, so rolls and index entries happen within a few messages."""


class ManualClock:
    """Milliseconds that move only when a test says so."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, milliseconds: int) -> None:
        self.now_ms += milliseconds


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path, clock: ManualClock) -> Iterator[Store]:
    with Store.open(data_dir, clock=clock) as opened:
        yield opened


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fast tests first, then the slow and fault ones, Spark's last (they share one session): the progress line
    moves from the start, and a failing fast test shows within a minute."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("spark"):
            return 2
        return 1 if item.get_closest_marker("slow") or item.get_closest_marker("fault") else 0

    items.sort(key=weight)


from tests.s3_server import s3_server, s3_uri  # noqa: E402,F401  (fixtures: a moto S3 server per run, a bucket per test)
