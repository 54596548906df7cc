"""The ``ledgerview`` command line: a thin shell over the library."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ledgerview.demo import run_demo
from storage.errors import LedgerviewError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledgerview",
        description="Keyed streams kept as a full history and a latest-per-key table.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the main job on built-in sample data in a local folder")
    demo.add_argument("--data", type=Path, default=Path("demo-data"),
                      help="data folder: new, empty, or made by an earlier demo (emptied first)")
    demo.add_argument("--ticks", type=int, default=200_000, help="number of price ticks to append")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            return run_demo(args.data, ticks=args.ticks)
    except LedgerviewError as error:
        print(f"ledgerview: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
