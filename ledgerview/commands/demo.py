"""``ledgerview demo``: the main job on built-in sample data (ledgerview/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ledgerview.commands.common import Subparsers, add_command
from ledgerview.errors import UsageError


def register(subparsers: Subparsers) -> None:
    demo = add_command(subparsers, "demo", run, store=False,
                       help="run the main job on built-in sample data in a local folder")
    demo.add_argument("--data", type=Path, default=Path("demo-data"),
                      help="data folder: new, empty, or made by an earlier demo (emptied first)")
    demo.add_argument("--ticks", type=int, default=200_000, help="number of price ticks to append")


def run(args: argparse.Namespace) -> int:
    from ledgerview.demo import DemoFolderError, run_demo  # Spark is imported only for the demo

    try:
        return run_demo(args.data, ticks=args.ticks)
    except DemoFolderError as error:
        raise UsageError(str(error)) from error
