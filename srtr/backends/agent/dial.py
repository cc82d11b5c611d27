"""How the node agent reaches its controller: the TLS connection (retried while the
controller starts; heartbeats and messages both travel on it), and the run dir's rendezvous
file, where a controller that adopts the job says where it listens.

Standard library and `srtr.net.tls` (stdlib `ssl` and `hashlib`) only, as the node agent it is
part of.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.net import tls

HANDSHAKE_TIMEOUT = 30.0


def read_rendezvous(path: Path) -> tuple[str, int] | None:
    """The HOST:PORT a controller wrote into the run dir's rendezvous file, if any."""
    try:
        host, _, port = path.read_text().strip().rpartition(":")
        return host.strip("[]"), int(port)
    except (OSError, ValueError):
        return None


async def connect(
    host: str, port: int, within: float, *, tls: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, retrying refusals (the controller may still be starting) for `within` s.
    `tls`: speak TLS (the caller pins the certificate before it sends anything)."""
    deadline = time.monotonic() + within
    delay = 0.05
    context = _client_context() if tls else None
    while True:
        try:
            return await asyncio.open_connection(
                host,
                port,
                limit=p.MAX_LINE,
                ssl=context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if context is not None else None,
            )
        except OSError:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)


@functools.lru_cache(maxsize=1)
def _client_context() -> ssl.SSLContext:
    """One context for every connection (hollow mode: a thousand agents in one process)."""
    return tls.client_context()
