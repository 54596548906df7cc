"""The ``ledgerview`` command line: a thin shell over the library, one module per command group in
ledgerview/commands/. Errors end the command with one line on stderr and an exit status from
ledgerview/exit_codes.py."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

from ledgerview.commands import (
    acls,
    clean,
    compaction,
    consume,
    demo,
    dump_log,
    groups,
    produce,
    remote,
    retention,
    serve,
    topics,
    users,
    verify,
)
from ledgerview.commands.common import add_store_options
from ledgerview.errors import UsageError
from ledgerview.exit_codes import EXIT_CODES_HELP, ExitCode, exit_code_for
from storage.errors import LedgerviewError

COMMAND_GROUPS = (topics, produce, consume, groups, compaction, clean, retention, remote, dump_log, verify, serve,
                  users, acls, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledgerview",
        description="Keyed streams kept as a full history (the raw log) and a latest-per-key table (the compacted "
                    "view). Every store command takes --data DIR (default $LEDGERVIEW_DATA or ./data) and, for a "
                    "store with a remote tier, --remote URI (needed once: the folder remembers it), before or after "
                    "the command; 'ledgerview COMMAND --help' is the reference of each.",
        epilog=f"exit statuses:\n{EXIT_CODES_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser, before_command=True)
    parser.add_argument("--version", action="version", version=f"ledgerview {version('ledgerview')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.remote is not None and not args.opens_store:
            raise UsageError(f"--remote is for commands that open a store; '{args.command}' does not (the service "
                             "takes its remote tier from [remote] uri in its config).")
        status: int = args.run(args)
        return status
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (consume | head): nothing left to say
        return ExitCode.OK
    except (LedgerviewError, OSError) as error:
        print(f"ledgerview: error: {_one_line(error)}", file=sys.stderr)
        return exit_code_for(error)


def _one_line(error: BaseException) -> str:
    """The error's message on one line, with its notes (what else happened, added where it was raised)."""
    if isinstance(error, OSError) and not isinstance(error, LedgerviewError) and error.filename is not None:
        message = f"{error.strerror}: {error.filename}"
    else:
        message = str(error)
    return " ".join(" ".join([message, *getattr(error, "__notes__", [])]).split())


if __name__ == "__main__":
    sys.exit(main())
