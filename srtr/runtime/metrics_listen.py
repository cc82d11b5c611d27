"""`srtr up --metrics-port [HOST:]PORT` and `--metrics-address HOST`, parsed.

Its own module, importing only argparse: every verb of the CLI builds `up`'s parser, and
`srtr status` must not pay for the metrics module's imports (the store, the recipe model).
"""

from __future__ import annotations

import argparse
from typing import Any

LOOPBACK = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (`[::1]:PORT` for IPv6) → (host, port); argparse's `type=`.

    A bare port listens on loopback only: the endpoint has no authentication, and on a shared
    login node every user could read it. `HOST:PORT` (or `--metrics-address`) chooses another
    address, such as 0.0.0.0 for a Prometheus on another machine.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host = LOOPBACK
    host = host.removeprefix("[").removesuffix("]") or LOOPBACK
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [HOST:]PORT with a port between 0 and 65535 (0 picks a free one)"
        )
    return host, int(port)


class ListenAction(argparse.Action):
    """`--metrics-port [HOST:]PORT` and `--metrics-address HOST`, in either order: the
    address, when given, replaces the port's host (`metrics_port` holds the (host, port))."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if self.dest == "metrics_address":
            host = str(values).removeprefix("[").removesuffix("]")
            namespace.metrics_address = host
            if namespace.metrics_port is not None:
                namespace.metrics_port = (host, namespace.metrics_port[1])
            return
        host, port = values
        namespace.metrics_port = (getattr(namespace, "metrics_address", None) or host, port)
