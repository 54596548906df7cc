"""Shared fixtures: a fresh data folder, a store on it with an injected clock, and the tiny-config preset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


SHARED_SESSION_FOLDERS = ("tests/spark/", "tests/spark_cluster/")
"""The tests of each of these folders share a session fixture that takes long to start (a Spark session, the
local-cluster Spark child): under pytest-xdist each folder is one unit of work, so each starts once per run."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Alone: fast tests first, then the slow and fault ones, Spark's last (they share one session), so a failing
    fast test shows within a minute. Under pytest-xdist (``make test``) the other way round: the units of work
    (pytest_xdist_make_scheduler) start in this order, and the longest first leaves no worker alone with a long
    unit at the end while the others wait."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("spark"):
            return 2
        return 1 if item.get_closest_marker("slow") or item.get_closest_marker("fault") else 0

    distributed = hasattr(config, "workerinput")
    items.sort(key=lambda item: -weight(item) if distributed else weight(item))


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist does not know the hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each test module is one unit of work, but each folder of SHARED_SESSION_FOLDERS is one; with
    ``--no-loadscope-reorder`` (as make test runs it) units go to the workers in the order of the tests. (xdist's
    ``loadgroup`` would do it with marks, but with pytest 9.2 it leaves every test ungrouped: it renames a test
    through ``Item._nodeid``, which pytest no longer reads.) A ``--dist`` other than xdist's default is left to
    xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSessionScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return next((folder for folder in SHARED_SESSION_FOLDERS if module.startswith(folder)), module)

    return SharedSessionScheduling(config, log)


from tests.s3_server import s3_server, s3_uri  # noqa: E402,F401  (fixtures: a moto S3 server per run, a bucket per test)
