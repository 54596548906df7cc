"""The ``ledgerview`` command line: a thin shell over the library, one module per command group in
ledgerview/commands/. Errors end the command with one line on stderr and an exit status from
ledgerview/exit_codes.py."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import version

from ledgerview.commands.common import add_store_options
from ledgerview.errors import UsageError
from ledgerview.exit_codes import EXIT_CODES_HELP, ExitCode, exit_code_for
from storage.errors import LedgerviewError

COMMAND_MODULES = {
    "topics": "topics", "produce": "produce", "consume": "consume", "groups": "groups", "compact": "compaction",
    "compaction-status": "compaction", "clean": "clean", "retention": "retention", "delete-records": "retention",
    "remote": "remote", "dump-log": "dump_log", "verify": "verify", "serve": "serve", "users": "users",
    "acls": "acls", "demo": "demo",
}
"""Each command and its module in ledgerview/commands/, in the order the help lists them."""
OPTIONS_WITH_VALUES = ("--data", "--remote")
"""The options taken before the command that are followed by a value (written whole: the parser takes no
abbreviation of them, which would hide their value from ``_command_named``)."""
HELP_OPTIONS = ("-h", "--help")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv`` (default: this process's arguments). Only the module of the command ``argv`` names is
    imported, when it names one: the modules import what their commands run on (the Kafka endpoint, the service,
    Spark), which would slow every other command's start; help and mistakes get every command."""
    parser = argparse.ArgumentParser(
        prog="ledgerview",
        description="Keyed streams kept as a full history (the raw log) and a latest-per-key table (the compacted "
                    "view). Every store command takes --data DIR (default $LEDGERVIEW_DATA or ./data) and, for a "
                    "store with a remote tier, --remote URI (needed once: the folder remembers it), before or after "
                    "the command; 'ledgerview COMMAND --help' is the reference of each.",
        epilog=f"exit statuses:\n{EXIT_CODES_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_store_options(parser, before_command=True)
    parser.add_argument("--version", action="version", version=f"ledgerview {version('ledgerview')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _command_named(sys.argv[1:] if argv is None else argv)
    for module in dict.fromkeys(COMMAND_MODULES.values()) if named is None else [COMMAND_MODULES[named]]:
        importlib.import_module(f"ledgerview.commands.{module}").register(commands)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option taken before the command or its value), if
    it is one and no help is asked for before it (help lists every command)."""
    words = iter(argv)
    for word in words:
        if word in HELP_OPTIONS:
            return None
        if word in OPTIONS_WITH_VALUES:
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMAND_MODULES else None
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
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
