"""SASL authentication of one connection on a SASL listener, as Kafka's SaslServerAuthenticator does it.

States, one request frame at a time:

1. HANDSHAKE_OR_VERSIONS: ApiVersions is answered (state 2) and SaslHandshake handled as in 2. Any other request
   closes the connection: nothing is served before authentication.
2. HANDSHAKE: SaslHandshake names a mechanism; one not in sasl.enabled.mechanisms is answered
   UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection closes. Version 0 of the handshake means
   the tokens that follow are raw frames (no request header); version 1 means they come in SaslAuthenticate.
3. AUTHENTICATE: each token goes to the mechanism; its answer goes back (raw, or in SaslAuthenticate's response).
   Wrong credentials: SASL_AUTHENTICATION_FAILED (raw tokens: no answer), after
   connection.failed.authentication.delay.ms (both), then the connection closes. A malformed token or another request
   closes it.
4. COMPLETE: the connection's principal is ``User:<name>``; requests are served.

Every frame before COMPLETE is at most sasl.server.max.receive.size bytes (the server reads it so).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from ledgerview.kafka.metadata import api_versions_response
from ledgerview.kafka.protocol import ApiKey, ErrorCode, encode_response, read_request_header, supported
from ledgerview.kafka.sasl_errors import SaslAuthenticationError, SaslProtocolError
from ledgerview.kafka.sasl_mechanisms import MechanismServer, mechanism_server
from storage.security_records import Credentials


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = "handshake or versions"
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass(frozen=True)
class Reply:
    """What to send back for one frame; ``failed``: send it after the failed-login delay, then close."""

    frame: bytes
    failed: bool = False


class SaslAuthenticator:
    def __init__(self, mechanisms: tuple[str, ...], credentials: Callable[[], Credentials]) -> None:
        self._mechanisms = mechanisms
        self._credentials = credentials
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        self._server: MechanismServer | None = None
        self._raw_tokens = False

    @property
    def user(self) -> str | None:
        return self._server.user if self._server is not None and self.state is SaslState.COMPLETE else None

    def receive(self, frame: bytes) -> Reply:
        """The reply to one frame; raises SaslProtocolError when the connection must close without one."""
        if self.state is SaslState.AUTHENTICATE and self._raw_tokens:
            return self._token(frame, None)
        header = read_request_header(frame)
        if not supported(header.api_key, header.api_version):
            if header.api_key == ApiKey.API_VERSIONS:
                return Reply(encode_response(api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION),
                                             header.correlation_id))
            raise SaslProtocolError(f"unsupported request: key {header.api_key} version {header.api_version}")
        key = ApiKey(header.api_key)
        body = memoryview(frame)[header.body_start :]
        if key is ApiKey.API_VERSIONS and self.state is SaslState.HANDSHAKE_OR_VERSIONS:
            self.state = SaslState.HANDSHAKE
            return Reply(encode_response(api_versions_response(header.api_version), header.correlation_id))
        if key is ApiKey.SASL_HANDSHAKE and self.state in (SaslState.HANDSHAKE_OR_VERSIONS, SaslState.HANDSHAKE):
            return self._handshake(_decode(SaslHandshakeRequest, body, header.api_version), header.api_version,
                                   header.correlation_id)
        if key is ApiKey.SASL_AUTHENTICATE and self.state is SaslState.AUTHENTICATE:
            request = _decode(SaslAuthenticateRequest, body, header.api_version)
            return self._token(bytes(request.auth_bytes), (header.api_version, header.correlation_id))
        raise SaslProtocolError(f"a {key.name} request in SASL state {self.state.value}: only ApiVersions, "
                                "SaslHandshake and SaslAuthenticate come before authentication")

    def _handshake(self, request: Any, version: int, correlation_id: int) -> Reply:
        mechanisms = list(self._mechanisms)
        if request.mechanism not in self._mechanisms:
            self.state = SaslState.FAILED
            response = SaslHandshakeResponse(version=version, error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM.value,
                                             mechanisms=mechanisms)
            return Reply(encode_response(response, correlation_id), failed=True)
        self._server = mechanism_server(request.mechanism, self._credentials)
        self._raw_tokens = version == 0
        self.state = SaslState.AUTHENTICATE
        return Reply(encode_response(SaslHandshakeResponse(version=version, error_code=0, mechanisms=mechanisms),
                                     correlation_id))

    def _token(self, token: bytes, framing: tuple[int, int] | None) -> Reply:
        """The mechanism's answer to ``token``: raw when ``framing`` is None, else in a SaslAuthenticate response
        of that (version, correlation id)."""
        assert self._server is not None
        try:
            answer = self._server.evaluate(token)
        except SaslAuthenticationError as error:
            self.state = SaslState.FAILED
            if framing is None:  # raw tokens have no error response: the delay, then the close
                return Reply(b"", failed=True)
            message = f"Authentication failed during authentication due to invalid credentials: {error}"
            return Reply(self._authenticate_response(framing, ErrorCode.SASL_AUTHENTICATION_FAILED, message, b""),
                         failed=True)
        if self._server.complete:
            self.state = SaslState.COMPLETE
        if framing is None:
            return Reply(struct.pack(">i", len(answer)) + answer)
        return Reply(self._authenticate_response(framing, ErrorCode.NONE, None, answer))

    @staticmethod
    def _authenticate_response(framing: tuple[int, int], error: ErrorCode, message: str | None,
                               answer: bytes) -> bytes:
        version, correlation_id = framing
        response = SaslAuthenticateResponse(version=version, error_code=error.value, error_message=message,
                                            auth_bytes=answer, session_lifetime_ms=0)
        return encode_response(response, correlation_id)


def _decode(kind: Any, body: memoryview, version: int) -> Any:
    try:
        return kind.decode(body, version=version)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError) as error:
        raise SaslProtocolError(f"a {kind.__name__} v{version} that does not parse: {error}") from None


def handle_sasl_handshake(broker: Any, request: Any, version: int) -> Any:
    """A SaslHandshake on a connection that is not authenticating (not a SASL listener, or already
    authenticated): ILLEGAL_SASL_STATE, as Kafka answers it."""
    return SaslHandshakeResponse(version=version, error_code=ErrorCode.ILLEGAL_SASL_STATE.value, mechanisms=[])


def handle_sasl_authenticate(broker: Any, request: Any, version: int) -> Any:
    """A SaslAuthenticate outside an exchange: ILLEGAL_SASL_STATE."""
    return SaslAuthenticateResponse(version=version, error_code=ErrorCode.ILLEGAL_SASL_STATE.value,
                                    error_message="No SASL exchange is in progress on this connection.",
                                    auth_bytes=b"", session_lifetime_ms=0)
