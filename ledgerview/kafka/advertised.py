"""The address the endpoint tells clients to connect to (the broker of Metadata, the coordinator of
FindCoordinator): Kafka's ``advertised.listeners``, one code path for every way it is given.

Listener names are the security protocols (Kafka's default listener.security.protocol.map), so an advertised
listener ``SASL_SSL://broker.example.com:9093`` is the address of the endpoint's SASL_SSL listener. As Kafka
checks them (KafkaConfig.validateValues): each advertised listener names a listener the endpoint has, at most once,
and none uses the nonroutable meta-address 0.0.0.0 (nor ``::``); an empty host is this machine's canonical host
name. The port is advertised as given (0 is refused: no client can connect to it).

A listener that ``advertised.listeners`` does not name is advertised as Kafka advertises it, with the port it bound:
its own host, or, when that host binds every interface (empty, ``0.0.0.0``, ``::``), this machine's canonical host
name (Kafka's ``InetAddress.getLocalHost.getCanonicalHostName``: ``socket.getfqdn()``), never the wildcard itself,
which a client on another machine cannot connect to. ``advertised_host`` (EndpointOptions, the service's
``[kafka] advertised_host``) is ledgerview's shorthand for advertising every listener at that host with the port it
bound; it cannot be given with ``advertised.listeners``.
"""

from __future__ import annotations

import functools
import socket
from collections import Counter

from ledgerview.kafka.security_options import Listener
from storage.errors import LedgerviewError

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
"""Hosts that bind every interface."""
NONROUTABLE_HOSTS = ("0.0.0.0", "::")


class AdvertisedListenersError(LedgerviewError):
    """advertised.listeners (or advertised_host) that clients could not use, or that names no listener."""

    def __init__(self, problem: str, advice: str) -> None:
        super().__init__(f"advertised.listeners: {problem}. {advice}")


def check_advertised(listeners: tuple[Listener, ...], advertised: tuple[Listener, ...],
                     advertised_host: str | None) -> None:
    """Raise AdvertisedListenersError unless ``advertised`` and ``advertised_host`` follow Kafka's rules for the
    endpoint's ``listeners``."""
    if advertised and advertised_host is not None:
        raise AdvertisedListenersError(f"given with advertised_host {advertised_host!r}",
                                       "Give one of the two (advertised.listeners names the host and port of each "
                                       "listener).")
    if advertised_host is not None and advertised_host.strip("[]") in WILDCARD_HOSTS:
        raise AdvertisedListenersError(f"advertised_host {advertised_host!r} is not an address a client can connect "
                                       "to", "Give this machine's host name or a routable IP address.")
    bound = Counter(listener.protocol for listener in listeners)
    names = ", ".join(protocol.value for protocol in bound)
    named = Counter(listener.protocol for listener in advertised)
    for item in advertised:
        if bound[item.protocol] == 0:
            raise AdvertisedListenersError(
                f"{item} names listener {item.protocol.value}, which the endpoint does not have",
                f"Advertised listener names must be equal to or a subset of those of listeners: {names}.")
        if named[item.protocol] > 1 or bound[item.protocol] > 1:
            raise AdvertisedListenersError(
                f"{item.protocol.value} is {'advertised' if named[item.protocol] > 1 else 'listened on'} more than "
                "once", "Each listener must have a different name (here, its security protocol).")
        if item.host in NONROUTABLE_HOSTS:
            raise AdvertisedListenersError(f"{item} cannot use the nonroutable meta-address {item.host}",
                                           "Use a routable IP address or a host name.")
        if item.port == 0:
            raise AdvertisedListenersError(f"{item} has port 0, which no client can connect to",
                                           "Give the port clients reach the listener on.")


def advertised_address(listener: Listener, bound_port: int, advertised: tuple[Listener, ...],
                       advertised_host: str | None) -> tuple[str, int]:
    """The host and port clients that came in on ``listener`` (which bound ``bound_port``) are told to connect to."""
    named = next((item for item in advertised if item.protocol is listener.protocol), None)
    if named is not None:
        host, port = named.host, named.port
    else:
        host, port = advertised_host or listener.host, bound_port
    return (canonical_host_name() if host in WILDCARD_HOSTS else host), port


@functools.cache
def canonical_host_name() -> str:
    """This machine's canonical host name, as Kafka's InetAddress.getLocalHost.getCanonicalHostName (looked up
    once: it may ask DNS)."""
    return socket.getfqdn()
