"""Why a SASL exchange failed: wrong credentials (SASL_AUTHENTICATION_FAILED) or a broken exchange
(ILLEGAL_SASL_STATE and a closed connection). Messages never carry a password."""

from __future__ import annotations

from storage.errors import LedgerviewError


class SaslAuthenticationError(LedgerviewError):
    """The client's credentials are wrong (or its user unknown): Kafka's SaslAuthenticationException."""


class SaslProtocolError(LedgerviewError):
    """A SASL message that is malformed or out of place: Kafka's IllegalSaslStateException."""
