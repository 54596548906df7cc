"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's ScramSaslServer speaks them: the key
derivation the ``users`` command stores, and the server side of one exchange.

The exchange, one SaslAuthenticate round trip per message:

1. client-first ``n,[a=authzid],n=user,r=cnonce[,ext]``: only the ``n`` GS2 flag (no channel binding), an authzid
   only when it names the user itself, as Kafka. The server answers ``r=cnonce+snonce,s=salt,i=iterations``. An
   unknown user gets a made-up salt (stable per user for this process) and fails at step 2, so a client cannot
   tell an unknown user from a wrong password.
2. client-final ``c=base64(gs2 header),r=nonce,p=proof``: the nonce and the GS2 header must be the ones of step 1,
   and H(proof XOR HMAC(StoredKey, AuthMessage)) must equal StoredKey. The server answers
   ``v=HMAC(ServerKey, AuthMessage)`` and the user is authenticated.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
from collections.abc import Callable

from ledgerview.kafka.sasl_errors import SaslAuthenticationError, SaslProtocolError
from storage.security_records import ScramCredential

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS_MIN = 4096
"""Kafka's ScramMechanism minimum iterations (and the default of kafka-configs)."""
ITERATIONS_MAX = 16384
SALT_BYTES = 32
NONCE_BYTES = 24
_FAKE_SALT_KEY = secrets.token_bytes(32)


def _hmac(name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, name).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def new_credential(mechanism: str, password: str, iterations: int = ITERATIONS_MIN) -> ScramCredential:
    """A credential for ``password`` with a fresh random salt: what is stored instead of the password."""
    if mechanism not in HASHES:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}; known: {', '.join(HASHES)}")
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise ValueError(f"{iterations} SCRAM iterations; allowed: {ITERATIONS_MIN} to {ITERATIONS_MAX}")
    salt = secrets.token_bytes(SALT_BYTES)
    return credential_for(mechanism, password, salt, iterations)


def credential_for(mechanism: str, password: str, salt: bytes, iterations: int) -> ScramCredential:
    """The credential ``password`` gives with this salt and iteration count."""
    name = HASHES[mechanism]
    salted = salted_password(mechanism, password, salt, iterations)
    stored_key = hashlib.new(name, _hmac(name, salted, b"Client Key")).digest()
    return ScramCredential(salt, stored_key, _hmac(name, salted, b"Server Key"), iterations)


def password_matches(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (for SASL/PLAIN), in constant time."""
    expected = credential_for(mechanism, password, credential.salt, credential.iterations).stored_key
    return hmac.compare_digest(expected, credential.stored_key)


class ScramState(enum.Enum):
    RECEIVE_CLIENT_FIRST = "receive client-first"
    RECEIVE_CLIENT_FINAL = "receive client-final"
    COMPLETE = "complete"
    FAILED = "failed"


class ScramServer:
    """The server side of one SCRAM exchange; ``lookup`` gives a user's credential for this mechanism or None."""

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential | None]) -> None:
        self.mechanism = mechanism
        self._hash = HASHES[mechanism]
        self._lookup = lookup
        self.state = ScramState.RECEIVE_CLIENT_FIRST
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2_header = ""
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""

    def evaluate(self, message: bytes) -> bytes:
        """The server's answer to the client's next message; raises SaslAuthenticationError (wrong credentials)
        or SaslProtocolError (a message out of place or malformed)."""
        try:
            if self.state is ScramState.RECEIVE_CLIENT_FIRST:
                return self._client_first(message.decode())
            if self.state is ScramState.RECEIVE_CLIENT_FINAL:
                return self._client_final(message.decode())
        except UnicodeDecodeError:
            self.state = ScramState.FAILED
            raise SaslProtocolError(f"a {self.mechanism} message that is not UTF-8") from None
        except (SaslAuthenticationError, SaslProtocolError):
            self.state = ScramState.FAILED
            raise
        raise SaslProtocolError(f"a {self.mechanism} message in state {self.state.value}; expected in states "
                                f"{ScramState.RECEIVE_CLIENT_FIRST.value}, {ScramState.RECEIVE_CLIENT_FINAL.value}")

    def _client_first(self, message: str) -> bytes:
        parts = message.split(",")
        if len(parts) < 4 or parts[0] != "n" or (parts[1] and not parts[1].startswith("a=")):
            raise SaslProtocolError(f"invalid {self.mechanism} client-first message: it must start 'n,,' or "
                                    "'n,a=user,' (channel binding is not supported)")
        attributes = _attributes(parts[2:])
        if "n" not in attributes or "r" not in attributes or not attributes["r"]:
            raise SaslProtocolError(f"invalid {self.mechanism} client-first message: no n= user or r= nonce")
        user = _sasl_name(attributes["n"])
        if parts[1] and _sasl_name(parts[1][2:]) != user:
            raise SaslAuthenticationError(f"authorization id {parts[1][2:]!r} is not the user {user!r}")
        credential = self._lookup(user)
        self._known = credential is not None
        self._credential = credential or self._made_up(user)
        self.user = user
        self._gs2_header = f"{parts[0]},{parts[1]},"
        self._client_first_bare = ",".join(parts[2:])
        self._nonce = attributes["r"] + base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode()
        salt = base64.b64encode(self._credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self._credential.iterations}"
        self.state = ScramState.RECEIVE_CLIENT_FINAL
        return self._server_first.encode()

    def _client_final(self, message: str) -> bytes:
        without_proof, _, proof_part = message.rpartition(",")
        attributes = _attributes(without_proof.split(","))
        if not proof_part.startswith("p=") or "c" not in attributes or "r" not in attributes:
            raise SaslProtocolError(f"invalid {self.mechanism} client-final message: it needs c=, r= and p=")
        if attributes["c"] != base64.b64encode(self._gs2_header.encode()).decode():
            raise SaslProtocolError("the client-final channel binding is not the GS2 header of the client-first")
        if attributes["r"] != self._nonce:
            raise SaslProtocolError("the client-final nonce is not the nonce of this exchange")
        assert self._credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._hash, self._credential.stored_key, auth_message)
        try:
            proof = base64.b64decode(proof_part[2:], validate=True)
        except ValueError:
            raise SaslProtocolError("the client proof is not base64") from None
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        stored = hashlib.new(self._hash, client_key).digest()
        if not (self._known and len(proof) == len(signature) and hmac.compare_digest(stored,
                                                                                     self._credential.stored_key)):
            raise SaslAuthenticationError("invalid credentials")
        self.state = ScramState.COMPLETE
        server_signature = _hmac(self._hash, self._credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)

    def _made_up(self, user: str) -> ScramCredential:
        salt = _hmac("sha256", _FAKE_SALT_KEY, user.encode())
        return ScramCredential(salt, b"\0" * hashlib.new(self._hash).digest_size, b"", ITERATIONS_MIN)


def _attributes(parts: list[str]) -> dict[str, str]:
    return {part[0]: part[2:] for part in parts if len(part) >= 2 and part[1] == "="}


def _sasl_name(name: str) -> str:
    """RFC 5802's saslname: ``=2C`` is a comma and ``=3D`` an equals sign."""
    return name.replace("=2C", ",").replace("=3D", "=")
