"""``ledgerview users add|alter|remove|list``: the SASL users of the Kafka endpoint (kafka-configs --alter
--add-config 'SCRAM-SHA-256=[...]' --entity-type users). The password is read from stdin or a file, never from the
command line (where ps and shell history would show it); only a salted credential is stored."""

from __future__ import annotations

import argparse
import sys

from ledgerview.commands.common import Subparsers, add_command, existing_data_folder, print_json, print_table, say
from ledgerview.errors import UsageError
from ledgerview.kafka.scram import HASHES, ITERATIONS_MIN, new_credential
from storage.security_records import Credentials, credentials_record

PASSWORD_BYTES_MAX = 1024


def register(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("users", help="add, change, remove and list the Kafka endpoint's SASL users",
                                  description="SASL users of the Kafka endpoint (PLAIN, SCRAM-SHA-256/512). The "
                                              "password comes from stdin or --password-file, never the command "
                                              "line; only salted SCRAM credentials are stored.")
    users = group.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    for name, run, text in (("add", run_add, "add a user (refused if it exists)"),
                            ("alter", run_alter, "set an existing user's password")):
        command = add_command(users, name, run, help=text)
        command.add_argument("user")
        command.add_argument("--password-file", type=argparse.FileType("r"), metavar="FILE",
                             help="read the password from FILE's first line (default: stdin)")
        command.add_argument("--mechanism", action="append", choices=tuple(HASHES), dest="mechanisms",
                             help="store a credential for this SCRAM mechanism (repeatable; default: both); PLAIN "
                                  "logins are checked against any of them")
        command.add_argument("--iterations", type=int, default=ITERATIONS_MIN,
                             help="PBKDF2 iterations (4096 to 16384; default %(default)s)")
    remove = add_command(users, "remove", run_remove, help="remove a user")
    remove.add_argument("user")
    listing = add_command(users, "list", run_list, help="every user and its mechanisms (no secrets)")
    listing.add_argument("--json", action="store_true", help="one JSON object per user")


def _password(args: argparse.Namespace) -> str:
    source = args.password_file or sys.stdin
    line = source.readline(PASSWORD_BYTES_MAX + 1).rstrip("\r\n")
    if not line or len(line) > PASSWORD_BYTES_MAX:
        raise UsageError(f"The password for {args.user!r} is empty or longer than {PASSWORD_BYTES_MAX} "
                         "characters; give it on stdin or in --password-file's first line.")
    return line


def _set(args: argparse.Namespace, *, exists: bool) -> int:
    if not args.user:
        raise UsageError("The user name is empty.")
    password = _password(args)
    try:
        credentials = {mechanism: new_credential(mechanism, password, args.iterations)
                       for mechanism in args.mechanisms or HASHES}
    except ValueError as error:
        raise UsageError(str(error)) from None

    def change(current: Credentials) -> Credentials:
        if (args.user in current) != exists:
            raise UsageError(f"User {args.user!r} already exists; use 'users alter' to change its password." if not
                             exists else f"No user {args.user!r}; 'users add' creates it.")
        return {**current, args.user: credentials}

    credentials_record(existing_data_folder(args)).update(change)
    say(f"{'Altered' if exists else 'Added'} user {args.user!r} ({', '.join(credentials)}).")
    return 0


def run_add(args: argparse.Namespace) -> int:
    return _set(args, exists=False)


def run_alter(args: argparse.Namespace) -> int:
    return _set(args, exists=True)


def run_remove(args: argparse.Namespace) -> int:
    def change(current: Credentials) -> Credentials:
        if args.user not in current:
            raise UsageError(f"No user {args.user!r}; 'users list' shows them.")
        return {user: mechanisms for user, mechanisms in current.items() if user != args.user}

    credentials_record(existing_data_folder(args)).update(change)
    say(f"Removed user {args.user!r}.")
    return 0


def run_list(args: argparse.Namespace) -> int:
    users = credentials_record(existing_data_folder(args)).read()
    rows = [(user, ",".join(sorted(mechanisms)), max(item.iterations for item in mechanisms.values()))
            for user, mechanisms in sorted(users.items())]
    if args.json:
        for user, mechanisms, iterations in rows:
            print_json({"user": user, "mechanisms": mechanisms.split(","), "iterations": iterations})
    else:
        print_table(("USER", "MECHANISMS", "ITERATIONS"), rows)
    return 0
