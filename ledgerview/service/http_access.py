"""Who may read the HTTP server's routes: the identity of a request (a bearer token, or the subject of its verified
TLS client certificate, spelled as the Kafka endpoint spells it) and whether that principal may see the service's
status (a super user of [http], or an ACL of the data folder allowing Describe on the cluster, by Kafka's rules).

Tokens are kept as SHA-256 digests only, in a file of lines ``<hex digest> <principal>`` (``#`` comments), read
when the server starts and again whenever it changes, so a token is added or revoked without a restart.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerview.kafka.authorizer import CLUSTER_NAME, Authorizer, Operation, ResourceType, Session
from ledgerview.kafka.security_options import SecurityOptions, is_loopback
from ledgerview.kafka.tls import certificate_principal
from ledgerview.service.logs import log_event
from storage.errors import LedgerviewError

logger = logging.getLogger("ledgerview.http")

_TOKEN_LINE = re.compile(r"(?P<digest>[0-9a-f]{64})\s+(?P<principal>User:\S.*)")


class TokenFileError(LedgerviewError):
    """The bearer token file cannot be read or has a line that is not ``<sha256 hex> User:NAME``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"Bearer token file {path}: {problem}. Each line is the SHA-256 hex digest of a token and "
                         "the principal it stands for (e.g. `<64 hex digits> User:ops`); # starts a comment.")


class InsecureHttpError(LedgerviewError):
    """The HTTP server reachable from other machines without TLS and authentication."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"Refusing to serve HTTP on {host}: it is not a loopback address, and anyone on the network could read "
            "the service's status and metrics in plain text. Set ssl.keystore.location (TLS) and tokens_file or "
            "ssl.client.auth = \"required\" in [http], or insecure = true in [http] to accept the risk.")


class Verdict(enum.IntEnum):
    """The HTTP status a request's identity earns."""

    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403


def read_tokens(path: Path) -> dict[str, str]:
    """The token file's principals by token digest; raises TokenFileError (never quoting a line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise TokenFileError(str(path), error.strerror or str(error)) from None
    tokens = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _TOKEN_LINE.fullmatch(text)
        if match is None:
            raise TokenFileError(str(path), f"line {number} is not a digest and a principal")
        tokens[match["digest"]] = match["principal"].strip()
    return tokens


class TokenFile:
    """The bearer token file, read again whenever it changes (its inode, size or modification time). Changed into
    one that cannot be read or parsed, it lets no token in until it is mended (fail closed: a revocation written
    with a typo must not leave the revoked token working), and says so in the log; at start, that is an error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen = self._identity()
        self._principals = read_tokens(path)

    def principals(self) -> dict[str, str]:
        """Principals by token digest, as the file holds them now."""
        with self._lock:
            identity = self._identity()
            if identity != self._seen:  # a file that went missing is logged once, then answers no token
                self._seen = identity
                try:
                    self._principals = read_tokens(self.path)
                except TokenFileError as error:
                    self._principals = {}
                    log_event(logger, logging.ERROR, "http.tokens_refused", error=str(error))
            return self._principals

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns


def token_digest(token: str) -> str:
    """What the token file holds for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_http_security(host: str, security: SecurityOptions, *, tokens: bool, insecure: bool) -> None:
    """Raises InsecureHttpError for a non-loopback ``host`` without TLS and authentication (bearer tokens, or
    client certificates required), unless ``insecure``."""
    authenticated = tokens or security.ssl_client_auth == "required"
    if not (insecure or is_loopback(host) or (security.keystore_given and authenticated)):
        raise InsecureHttpError(host)


@dataclass(frozen=True)
class HttpAccess:
    """The HTTP server's access rule. Without a token file or client certificates every request is served
    (loopback only, unless insecure); with either, a request needs an identity allowed by ``verdict``, even
    while the token file holds no token."""

    tokens: TokenFile | None
    """The bearer token file, if one is configured."""
    client_certificates: bool
    """ssl.client.auth is required or requested: a verified certificate names a principal."""
    authorizer: Authorizer
    connection_failed_authentication_delay_ms: int = SecurityOptions.connection_failed_authentication_delay_ms
    """Kafka's connection.failed.authentication.delay.ms, the Kafka endpoint's name and default: how long a request
    whose credentials name no one waits for its 401, which slows token guessing."""

    @classmethod
    def of(cls, data: Path, security: SecurityOptions, tokens_file: str) -> HttpAccess:
        tokens = TokenFile(Path(tokens_file)) if tokens_file else None
        return cls(tokens, security.ssl_client_auth != "none",
                   Authorizer(data, SecurityOptions(super_users=security.super_users)),
                   security.connection_failed_authentication_delay_ms)

    @property
    def enforced(self) -> bool:
        return self.tokens is not None or self.client_certificates

    def principal(self, authorization: str | None, certificate: dict[str, Any] | None) -> str | None:
        """The request's principal: its bearer token's when it sends an Authorization header (a token not in the
        file is no one, whatever the certificate), else its certificate's; None without either."""
        if authorization is None:
            return certificate_principal(certificate)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip() or self.tokens is None:
            return None
        digest = token_digest(token.strip())
        return next((principal for known, principal in self.tokens.principals().items()
                     if hmac.compare_digest(known, digest)), None)

    def failed_authentication_delay_s(self, authorization: str | None, status: int) -> float:
        """How long a request with this Authorization header waits for its answer of HTTP ``status``: the delay
        when it presented credentials and they named no one (401); none when it presented none, or got any other
        answer."""
        if authorization is None or status != Verdict.UNAUTHENTICATED:
            return 0.0
        return self.connection_failed_authentication_delay_ms / 1000

    def verdict(self, principal: str | None, host: str) -> Verdict:
        if not self.enforced:
            return Verdict.ALLOWED
        if principal is None:
            return Verdict.UNAUTHENTICATED
        allowed = self.authorizer.authorize(Session(principal, host), Operation.DESCRIBE, ResourceType.CLUSTER,
                                            CLUSTER_NAME)
        return Verdict.ALLOWED if allowed else Verdict.FORBIDDEN
