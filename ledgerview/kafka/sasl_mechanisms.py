"""The SASL mechanisms the endpoint offers, each a small server: PLAIN (RFC 4616, checked against the stored
salted credential, as no password is kept) and SCRAM-SHA-256/512 (ledgerview/kafka/scram.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ledgerview.kafka.sasl_errors import SaslAuthenticationError, SaslProtocolError
from ledgerview.kafka.scram import HASHES, ScramServer, ScramState, credential_for, password_matches
from storage.security_records import Credentials, ScramCredential

PLAIN = "PLAIN"
MECHANISMS = (PLAIN, *HASHES)
"""Every mechanism sasl.enabled.mechanisms may name."""
_DUMMY = credential_for("SCRAM-SHA-256", "", b"\0" * 32, 4096)


class MechanismServer(Protocol):
    user: str | None

    @property
    def complete(self) -> bool: ...

    def evaluate(self, message: bytes) -> bytes:
        """The answer to the client's next message; raises SaslAuthenticationError or SaslProtocolError."""
        ...


class PlainServer:
    """``[authzid] NUL authcid NUL password`` in one message; the authzid, when given, must be the authcid."""

    def __init__(self, credentials: Callable[[], Credentials]) -> None:
        self._credentials = credentials
        self.user: str | None = None
        self._complete = False

    @property
    def complete(self) -> bool:
        return self._complete

    def evaluate(self, message: bytes) -> bytes:
        if self._complete:
            raise SaslProtocolError("a PLAIN message after the exchange completed")
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise SaslProtocolError("invalid PLAIN message: expected authzid NUL user NUL password")
        try:
            authorization, user, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise SaslProtocolError("invalid PLAIN message: not UTF-8") from None
        if not user or not password:
            raise SaslAuthenticationError("the PLAIN user or password is empty")
        if authorization and authorization != user:
            raise SaslAuthenticationError(f"authorization id {authorization!r} is not the user {user!r}")
        mechanism, credential = _any_credential(self._credentials().get(user, {}))
        if not password_matches(mechanism, credential, password) or credential is _DUMMY:
            raise SaslAuthenticationError("invalid credentials")
        self.user, self._complete = user, True
        return b""


class ScramMechanismServer:
    """ScramServer over the stored credentials of one mechanism."""

    def __init__(self, mechanism: str, credentials: Callable[[], Credentials]) -> None:
        self._server = ScramServer(mechanism, lambda user: credentials().get(user, {}).get(mechanism))
        self.user: str | None = None

    @property
    def complete(self) -> bool:
        return self._server.state is ScramState.COMPLETE

    def evaluate(self, message: bytes) -> bytes:
        answer = self._server.evaluate(message)
        if self.complete:
            self.user = self._server.user
        return answer


def _any_credential(mechanisms: dict[str, ScramCredential]) -> tuple[str, ScramCredential]:
    """A stored credential to check a PLAIN password against (a made-up one for an unknown user, so the check
    costs the same)."""
    for mechanism in HASHES:
        if mechanism in mechanisms:
            return mechanism, mechanisms[mechanism]
    return "SCRAM-SHA-256", _DUMMY


def mechanism_server(mechanism: str, credentials: Callable[[], Credentials]) -> MechanismServer:
    """A fresh server for one exchange of ``mechanism`` (one of MECHANISMS)."""
    if mechanism == PLAIN:
        return PlainServer(credentials)
    return ScramMechanismServer(mechanism, credentials)
