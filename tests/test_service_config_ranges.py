"""The service checks its config's ranges before anything starts (an interval of 0 would spin a loop at full CPU;
a port past 65535 is no port), and a port in use stops it before it creates a topic, naming the address.
Invariant 10 (DESIGN.md): bad input gets a clear error and changes nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledgerview.errors import ServiceConfigError
from ledgerview.service.config import parse_service_config
from storage.files import TOPICS_FOLDER


@pytest.mark.parametrize(("raw", "message"), [
    ({"compaction": {"interval_s": 0}}, r"\[compaction\] interval_s: 0 is not above 0 seconds"),
    ({"service": {"flush_interval_s": -1.5}}, r"\[service\] flush_interval_s: -1.5 is not above 0 seconds"),
    ({"http": {"port": 99999}}, r"\[http\] port: 99999 is not a port \(0 to 65535"),
    ({"kafka": {"port": -1}}, r"\[kafka\] port: -1 is not a port"),
    ({"topics": [{"name": "t", "partitions": 0}]}, r"\[\[topics\]\] #1 partitions: 0 is below 1"),
    # A wait past threading.TIMEOUT_MAX raises OverflowError in the loop's thread, which died with a traceback.
    ({"compaction": {"interval_s": 1e10}}, r"\[compaction\] interval_s: 10000000000.0 is not above 0 seconds and at "
                                           r"most 9223372036 \(the longest a thread waits\)"),
    ({"retention": {"interval_s": float("inf")}}, r"\[retention\] interval_s: inf is not above 0 seconds"),
    ({"cleaner": {"interval_s": float("nan")}}, r"\[cleaner\] interval_s: nan is not above 0 seconds"),
    ({"sources": [{"name": "g", "type": "generator", "topic": "t", "interval_s": 1e300}]},
     r"\[\[sources\]\] #1 interval_s: 1e\+300 is not above 0 seconds and at most"),
    # A negative limit made the generator produce nothing, without a word.
    ({"sources": [{"name": "g", "type": "generator", "topic": "t", "limit": -1}]},
     r"\[\[sources\]\] 'g' limit: must be >= 0 \(0: never stops\)"),
    ({"sources": [{"name": "g", "type": "generator", "topic": "t", "tombstone_every": -2}]},
     r"\[\[sources\]\] 'g' tombstone_every: must be >= 0 \(0: no tombstones\)"),
])
def test_out_of_range_values_are_refused_naming_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ServiceConfigError, match=message):
        parse_service_config(raw, "service.toml")


@pytest.mark.slow
def test_a_port_in_use_stops_the_service_before_it_changes_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "service.toml"
        config.write_text(f'[store]\ndata = "{tmp_path / "data"}"\n[http]\nport = {port}\n'
                          '[[topics]]\nname = "events"\n')
        result = subprocess.run([sys.executable, "-m", "ledgerview", "serve", "--config", str(config)],
                                capture_output=True, timeout=60)
    assert result.returncode != 0
    assert f"Cannot listen on 127.0.0.1:{port} ([http] host and port)" in result.stderr.decode()
    topics = tmp_path / "data" / TOPICS_FOLDER
    assert not topics.exists() or not any(topics.iterdir())
