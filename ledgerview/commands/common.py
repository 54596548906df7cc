"""What several commands share: the data-folder and remote-tier options, ``key=value`` pairs, opening the store,
printing."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ledgerview.errors import UsageError
from storage import Store
from storage.errors import UnknownTopicError
from storage.files import TOPICS_FOLDER
from storage.object_store import RemoteEndpointError, RemoteStorageError, open_object_store

DATA_ENVIRONMENT = "LEDGERVIEW_DATA"
Run = Callable[[argparse.Namespace], int]
Subparsers = Any
"""argparse's private ``_SubParsersAction``, which has no public name to annotate with."""


def add_store_options(parser: argparse.ArgumentParser, *, before_command: bool) -> None:
    """``--data`` and ``--remote``, taken before the command (``ledgerview --data X topics list``) and after it.
    The defaults live on the top-level parser only: a command's own option sets the value when given and leaves the
    one given before the command alone when not."""
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get(DATA_ENVIRONMENT, "data")) if before_command else argparse.SUPPRESS,
                        help=f"the store's data folder (default: ${DATA_ENVIRONMENT} or ./data)")
    parser.add_argument("--remote", metavar="URI", default=None if before_command else argparse.SUPPRESS,
                        help="the store's remote tier, s3://bucket/prefix or file:///mount/prefix; the data folder "
                             "remembers it, so later commands need no --remote (S3 endpoint and credentials come "
                             "from the AWS_* environment variables)")


def store_parent() -> argparse.ArgumentParser:
    """The ``--data`` and ``--remote`` options every store command takes."""
    parent = argparse.ArgumentParser(add_help=False)
    add_store_options(parent, before_command=False)
    return parent


def add_command(subparsers: Subparsers, name: str, run: Run, *, help: str, description: str | None = None,
                store: bool = True) -> argparse.ArgumentParser:
    """A subcommand; ``store``: it opens the store at --data (and takes --remote)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help, parents=[store_parent()] if store else [],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run, opens_store=store)
    return parser


def existing_data_folder(args: argparse.Namespace) -> Path:
    """``--data``, which must be a store's folder (it has ``__topics``): a typo in --data must not make a store of
    a missing folder, nor of one that holds something else."""
    data = Path(args.data)
    if not (data / TOPICS_FOLDER).is_dir():
        found = "is a file" if data.is_file() else "holds no store" if data.is_dir() else "does not exist"
        raise UsageError(f"No data folder at {data} (it {found}); pass --data with the store's folder "
                         f"(or set ${DATA_ENVIRONMENT}); 'ledgerview topics create' makes a new store.")
    return data


def open_existing_store(args: argparse.Namespace) -> Store:
    """The store at ``--data``, which must exist."""
    existing_data_folder(args)
    return open_store(args)


def open_store_for_reading(args: argparse.Namespace) -> Store:
    """The store at ``--data``, which must exist, for a command that only reads (Store.open_for_reading)."""
    existing_data_folder(args)
    if args.remote is not None:
        check_remote_uri(args.remote)
    return Store.open_for_reading(args.data, remote=args.remote)


def open_store(args: argparse.Namespace) -> Store:
    """The store at ``--data`` (created if missing), with the remote tier ``--remote`` names, else the one the
    folder remembers, if any."""
    if args.remote is not None:
        check_remote_uri(args.remote)
    return Store.open(args.data, remote=args.remote)


def check_remote_uri(uri: str) -> None:
    """Refuse a URI that is no remote tier before the data folder remembers it (the folder would refuse every
    other URI from then on). A tier that cannot be reached now (an OSError from pyarrow) is not the URI's fault: that
    error stands as it is."""
    try:
        open_object_store(uri)
    except RemoteEndpointError as error:  # the environment's fault, not the URI's
        raise UsageError(f"{error} Nothing was changed.") from None
    except RemoteStorageError as error:
        if isinstance(error.__cause__, OSError):
            raise
        raise UsageError(f"--remote {uri}: {error.reason}; {_REMOTE_FORMS}") from None
    except ValueError as error:  # urllib's, for a URI it cannot split (storage lets it through)
        raise UsageError(f"--remote {uri}: {error}; {_REMOTE_FORMS}") from None


_REMOTE_FORMS = "a remote tier is a URI such as s3://bucket/prefix or file:///mount/prefix. Nothing was changed."


def require_topic(store: Store, topic: str) -> None:
    """Fail early with the list of topics, before any work starts."""
    if topic not in store.list_topics():
        raise UnknownTopicError(topic, store.list_topics())


def parse_pairs(pairs: Iterable[str], option: str) -> dict[str, str]:
    """``key=value`` strings into a mapping; a pair without ``=`` is a usage error."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise UsageError(f"{option} {pair!r} is not key=value; write it as {option} retention.ms=86400000.")
        parsed[key.strip()] = value.strip()
    return parsed


def print_json(record: object) -> None:
    print(json.dumps(record, sort_keys=True))


def print_table(headings: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Columns right-aligned under their headings, as kafka-topics and kafka-log-dirs print them."""
    text_rows = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(heading), *(len(row[i]) for row in text_rows)]) for i, heading in enumerate(headings)]
    print("  ".join(heading.rjust(width) for heading, width in zip(headings, widths, strict=True)))
    for row in text_rows:
        print("  ".join(value.rjust(width) for value, width in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return str(value)


def say(message: str) -> None:
    """A line about what was done, on stderr so that stdout stays data."""
    print(message, file=sys.stderr)


def iso_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 time; one without a zone is UTC, as Kafka's tools read it
    (kafka-consumer-groups --to-datetime), whatever the machine's zone. Raises ValueError if it is none."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)
