"""TLS for the endpoint's listeners and the HTTP server (Python's ssl module), from Kafka's ssl.* settings, and
the principal a client certificate names, spelled as Kafka's X500Principal.getName() (RFC 2253: most specific
part first, ``CN=alice,OU=eng,O=Example,C=GB``)."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ledgerview.kafka.security_options import SecurityConfigError, SecurityOptions
from storage.errors import LedgerviewError

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
_RFC2253_KEYWORDS = {"commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
                     "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
                     "domainComponent": "DC", "userId": "UID"}
_SPECIAL = ',+"\\<>;='


class TlsSetupError(LedgerviewError):
    """The key, certificate or trust store cannot be loaded; nothing listens."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"Cannot set up TLS: {what}: {reason}. The keystore must be PEM (private key and "
                         "certificate chain), the truststore PEM CA certificates.")


def server_context(security: SecurityOptions, client_auth: str) -> ssl.SSLContext:
    """A server-side context with the keystore, the truststore and ``client_auth`` (required, requested, none);
    raises TlsSetupError or SecurityConfigError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[name] for name in security.ssl_enabled_protocols)
    if not versions:
        raise SecurityConfigError("ssl.enabled.protocols", "empty", f"Allowed: {', '.join(_VERSIONS)}.")
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    try:
        with _keystore_files(security) as (certificate, key):
            context.load_cert_chain(certificate, key, password=security.ssl_key_password or None)
    except (ssl.SSLError, OSError) as error:
        raise TlsSetupError("ssl.keystore", str(error)) from None
    context.verify_mode = _VERIFY[client_auth]
    if security.truststore_given:
        try:
            context.load_verify_locations(cafile=security.ssl_truststore_location or None,
                                          cadata=security.ssl_truststore_certificates or None)
        except (ssl.SSLError, OSError) as error:
            raise TlsSetupError("ssl.truststore", str(error)) from None
    return context


@contextmanager
def _keystore_files(security: SecurityOptions) -> Iterator[tuple[str, str | None]]:
    """Paths load_cert_chain can read: the keystore file, or the inline PEM written to a private temporary
    folder that is removed as soon as it is loaded (ssl cannot load a key from memory)."""
    if security.ssl_keystore_location:
        yield security.ssl_keystore_location, None
        return
    with tempfile.TemporaryDirectory(prefix="ledgerview-tls-") as folder:
        paths = []
        for name, text in (("chain.pem", security.ssl_keystore_certificate_chain), ("key.pem",
                                                                                  security.ssl_keystore_key)):
            path = os.path.join(folder, name)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
            paths.append(path)
        yield paths[0], paths[1]


def certificate_principal(certificate: dict[str, Any] | None) -> str | None:
    """``User:<subject>`` for a verified peer certificate (ssl's getpeercert()), or None without one."""
    if not certificate or "subject" not in certificate:
        return None
    parts = ["+".join(f"{_RFC2253_KEYWORDS.get(name, name)}={_escaped(value)}" for name, value in rdn)
             for rdn in reversed(certificate["subject"])]
    return "User:" + ",".join(parts)


def _escaped(value: str) -> str:
    escaped = "".join("\\" + character if character in _SPECIAL else character for character in value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    return escaped[:-1] + "\\ " if escaped.endswith(" ") else escaped
