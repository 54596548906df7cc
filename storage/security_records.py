"""The data folder's security records: the SCRAM credentials of its users and its ACLs, each one record of the
project's format (storage/records.py) at the top of the data folder, replaced atomically under a lock so the CLI
and the Kafka endpoint's CreateAcls/DeleteAcls may change them at once, and read again by a running endpoint as
soon as a change lands (the file's identity is compared on each read, so a change needs no restart).

Passwords are never stored: a credential holds a salt, an iteration count and the keys RFC 5802 derives from
the salted password (StoredKey, ServerKey), as Kafka's ScramCredential does.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from storage.fileio import write_atomically
from storage.locks import FileLock
from storage.records import CorruptRecordError, decode_record, encode_record

CREDENTIALS_RECORD = "scram-credentials"
CREDENTIALS_FILE = "scram-credentials.json"
ACLS_RECORD = "acls"
ACLS_FILE = "acls.json"
SECURITY_LOCK = ".security.lock"
RECORD_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True)
class ScramCredential:
    """One user's credential for one SCRAM mechanism (what RFC 5802's server keeps)."""

    salt: bytes
    """Random salt the password was salted with."""
    stored_key: bytes
    """H(HMAC(SaltedPassword, "Client Key")): checks a client's proof."""
    server_key: bytes
    """HMAC(SaltedPassword, "Server Key"): signs the server's final message."""
    iterations: int
    """PBKDF2 iterations of SaltedPassword (Kafka: 4096 to 16384)."""

    def encode(self) -> dict[str, Any]:
        return {"salt": _b64(self.salt), "stored_key": _b64(self.stored_key), "server_key": _b64(self.server_key),
                "iterations": self.iterations}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> ScramCredential:
        return cls(base64.b64decode(body["salt"]), base64.b64decode(body["stored_key"]),
                   base64.b64decode(body["server_key"]), int(body["iterations"]))


Credentials = dict[str, dict[str, ScramCredential]]
"""user name -> mechanism (``SCRAM-SHA-256``, ``SCRAM-SHA-512``) -> credential."""


@dataclass(frozen=True)
class AclEntry:
    """One ACL binding as kafka-acls shows it: ``principal`` may (or may not) ``operation`` ``resource_name``."""

    resource_type: str
    """``TOPIC``, ``GROUP`` or ``CLUSTER`` (whose one name is ``kafka-cluster``)."""
    resource_name: str
    """The name, a prefix (``pattern_type`` PREFIXED), or ``*`` for every resource of the type."""
    pattern_type: str
    """``LITERAL`` or ``PREFIXED``."""
    principal: str
    """``User:<name>`` (a SASL user or a certificate's subject), or ``User:*`` for every principal."""
    host: str
    """Client address the entry applies to; ``*`` for any."""
    operation: str
    """Kafka's AclOperation name: ``READ``, ``WRITE``, ``DESCRIBE``, ``CREATE``, ``DELETE``, ``ALTER``,
    ``IDEMPOTENT_WRITE``, ``ALL``, ..."""
    permission: str
    """``ALLOW`` or ``DENY`` (a matching DENY wins over every ALLOW)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class SecurityRecord(Generic[T]):
    """One security record of a data folder: read (again only when the file changed) and updated under a lock."""

    def __init__(self, root: Path, name: str, kind: str, decode: Callable[[dict[str, Any]], T],
                 encode: Callable[[T], dict[str, Any]], empty: Callable[[], T]) -> None:
        self.path = Path(root) / name
        self._lock_path = Path(root) / SECURITY_LOCK
        self._kind, self._decode, self._encode, self._empty = kind, decode, encode, empty
        self._seen: tuple[int, int, int] | None = None
        self._value: T = empty()

    def read(self) -> T:
        """The record's current value (empty when there is no record); raises CorruptRecordError."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._value = None, self._empty()
            return self._value
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if identity != self._seen:
            _, body = decode_record(self.path, self.path.read_bytes(), self._kind, max_version=RECORD_VERSION)
            try:
                self._value = self._decode(body)
            except (KeyError, TypeError, ValueError) as error:
                raise CorruptRecordError(str(self.path), self._kind, f"a field is missing or wrong ({error})") from None
            self._seen = identity
        return self._value

    def update(self, change: Callable[[T], T]) -> T:
        """Replace the record with ``change(current)`` atomically, under the folder's security lock."""
        with FileLock(self._lock_path):
            value = change(self.read())
            write_atomically(self.path, encode_record(self._kind, RECORD_VERSION, self._encode(value)))
            os.chmod(self.path, 0o600)  # salted keys still allow guessing passwords offline: owner only
            return value


def credentials_record(root: Path) -> SecurityRecord[Credentials]:
    """The SCRAM credentials of the data folder ``root``."""
    return SecurityRecord(root, CREDENTIALS_FILE, CREDENTIALS_RECORD, _decode_credentials, _encode_credentials, dict)


def acls_record(root: Path) -> SecurityRecord[tuple[AclEntry, ...]]:
    """The ACLs of the data folder ``root``."""
    return SecurityRecord(root, ACLS_FILE, ACLS_RECORD, _decode_acls, _encode_acls, tuple)


def _decode_credentials(body: dict[str, Any]) -> Credentials:
    return {user: {mechanism: ScramCredential.decode(fields) for mechanism, fields in mechanisms.items()}
            for user, mechanisms in body["users"].items()}


def _encode_credentials(credentials: Credentials) -> dict[str, Any]:
    return {"users": {user: {mechanism: credential.encode() for mechanism, credential in mechanisms.items()}
                      for user, mechanisms in credentials.items()}}


def _decode_acls(body: dict[str, Any]) -> tuple[AclEntry, ...]:
    return tuple(AclEntry(**entry) for entry in body["acls"])


def _encode_acls(acls: tuple[AclEntry, ...]) -> dict[str, Any]:
    return {"acls": [asdict(entry) for entry in acls]}
