"""kcat (Debian's package, on librdkafka 2.0.2) against the endpoint: -L lists both names of each topic, -P
produces (gzip too), -C -e consumes to the end and exits, including the compacted name after a compaction, which
only works when the view's last batch reaches the high-water mark. `make test` installs kcat; without it (no apt)
these tests skip."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from compactor import Compactor
from tests.kafka_support import Running, kafka

__all__ = ["kafka"]

KCAT = shutil.which("kcat")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it with apt-get)")]


def _kcat(running: Running, *arguments: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    done = subprocess.run([KCAT, "-b", running.bootstrap, "-X", "api.version.request.timeout.ms=20000", *arguments],
                          input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_lists_produces_and_consumes(kafka: Running) -> None:
    kafka.store.create_topic("lines", partitions=1)
    listing = _kcat(kafka, "-L")
    assert 'topic "lines" with 1 partitions' in listing
    assert 'topic "lines.compacted" with 1 partitions' in listing
    _kcat(kafka, "-P", "-t", "lines", "-K", ":", stdin="a:1\nb:2\na:3\n")
    _kcat(kafka, "-P", "-t", "lines", "-K", ":", "-z", "gzip", stdin="c:4\n")
    table = kafka.store.read("lines", 0)
    assert list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == [
        (b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", b"4")]
    consumed = _kcat(kafka, "-C", "-t", "lines", "-e", "-o", "1", "-f", "%o %k=%s\n")
    assert consumed.splitlines() == ["1 b=2", "2 a=3", "3 c=4"]


def test_kcat_consumes_the_compacted_name_to_the_end(kafka: Running) -> None:
    kafka.store.create_topic("state", partitions=1)
    kafka.store.append("state", [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", b"4"), (b"b", None)], partition=0)
    Compactor(kafka.store).compact("state")
    consumed = _kcat(kafka, "-C", "-t", "state.compacted", "-e", "-o", "beginning", "-f", "%o %k=%s\n")
    assert consumed.splitlines() == ["2 a=3", "3 c=4"]
