"""``python -m ledgerview.kafka DATA [--config server.properties] [--insecure] [--host H] [--port P]
[--advertised-listeners PROTOCOL://HOST:PORT] [--compacted-suffix S]
[--socket-request-max-bytes N] [--fetch-max-bytes N] [--connections-max-idle-ms N] [--log-level L] ...``
(one option per integer setting but the group coordinator's, which --config sets: max.connections,
queued.max.request.bytes, offsets.retention.minutes, frame.stall.timeout.ms, ...): run
the Kafka endpoint alone in this process until SIGTERM or SIGINT. ``--config`` reads Kafka broker properties
(listeners, ssl.*, sasl.*, authorizer.class.name, super.users, ...; docs/security.md); its values win over the
options. Prints ``listening on HOST:PORT`` (then `` (SSL)`` and so on, for a listener not PLAINTEXT) for each
listener once clients may connect (with port 0 that names the
port picked), so tests and benchmarks can start it as a real process. Logs go to stderr as text lines, at INFO
and above by default (as a Kafka broker's do): refused and closed connections, failed logins, damaged partitions."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from ledgerview.kafka.broker import SETTINGS, EndpointOptions
from ledgerview.kafka.broker_config import endpoint_options, read_properties
from ledgerview.kafka.security_options import SecurityProtocol
from ledgerview.kafka.server import KafkaEndpoint
from storage.errors import LedgerviewError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ledgerview.kafka", description=__doc__)
    parser.add_argument("data", help="the store's data folder")
    parser.add_argument("--config", type=Path, metavar="FILE", help="Kafka broker properties (server.properties)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback listener without TLS and authentication")
    parser.add_argument("--host", default=EndpointOptions.host)
    parser.add_argument("--port", type=int, default=EndpointOptions.port)
    parser.add_argument("--advertised-listeners", metavar="PROTOCOL://HOST:PORT",
                        help="Kafka's advertised.listeners: where clients are told to connect, e.g. "
                             "PLAINTEXT://broker.example.com:9092 (default: the listener's host, or this machine's "
                             "canonical host name when it binds every interface)")
    parser.add_argument("--compacted-suffix", default=EndpointOptions.compacted_suffix)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="the least severe log lines written to stderr (default %(default)s)")
    for name in SETTINGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(EndpointOptions, name),
                            metavar="N", help=f"{name.replace('_', '.')} (default %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def on_signal(number: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        options = EndpointOptions(host=args.host, port=args.port, compacted_suffix=args.compacted_suffix,
                                  insecure=args.insecure, **{name: getattr(args, name) for name in SETTINGS})
        properties = {} if args.config is None else read_properties(args.config)
        if properties:
            options = endpoint_options(properties, str(args.config), options)
        if args.advertised_listeners is not None and "advertised.listeners" not in properties:
            options = endpoint_options({"advertised.listeners": args.advertised_listeners},
                                       "--advertised-listeners", options)  # against the config's listeners
    except (ValueError, OSError, LedgerviewError) as error:
        parser.error(str(error))
    with KafkaEndpoint(args.data, options=options) as endpoint:
        for listener, port in zip(options.bound_listeners, endpoint.ports, strict=True):
            protocol = "" if listener.protocol is SecurityProtocol.PLAINTEXT else f" ({listener.protocol.value})"
            print(f"listening on {listener.host or '0.0.0.0'}:{port}{protocol}", flush=True)
        while not stop.wait(1.0):
            pass
    sys.exit(0)


if __name__ == "__main__":
    main()
