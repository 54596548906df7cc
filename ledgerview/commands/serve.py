"""``ledgerview serve``: run the service (ledgerview/service/run.py) until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
from pathlib import Path

from ledgerview.commands.common import Subparsers, add_command
from ledgerview.service.config import read_service_config
from ledgerview.service.run import serve

DESCRIPTION = """Run the service: ingest the configured sources, compact topics past compaction.threshold.bytes,
apply retention, flush and checkpoint; health, status and metrics over HTTP (/health, /status, /metrics on
127.0.0.1 by default). Logs are JSON lines on stderr. SIGTERM or Ctrl-C stops it cleanly; after kill -9 it
restarts without losing or repeating messages.

example:
  ledgerview serve --config conf/ledgerview.toml
"""


def register(subparsers: Subparsers) -> None:
    command = add_command(subparsers, "serve", run, store=False, help="run the service", description=DESCRIPTION)
    command.add_argument("--config", type=Path, default=Path("conf/ledgerview.toml"),
                         help="the service config (default: conf/ledgerview.toml)")


def run(args: argparse.Namespace) -> int:
    return serve(read_service_config(args.config))
