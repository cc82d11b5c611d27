"""The HTTP endpoint of srtr's own metrics, bounded: nobody who can reach the port costs the
job more than `MAX_CONNECTIONS` threads, `MAX_REQUEST` bytes read each and `TIMEOUT` seconds.

prometheus-client's own server starts a thread per connection with no timeout and no cap, so
300 idle connections held 300 threads. Here a connection beyond the cap, or beyond
`PER_SOURCE` from one address, is closed at once (counted, one summary line per interval,
`listen_gate.Summary`); a request is read with a socket timeout and at most `MAX_REQUEST`
bytes (a scrape's GET is a few hundred), and nothing the peer sent is logged.
"""

from __future__ import annotations

import io
import socket
import threading
from collections import Counter
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from srtr.net.listen_gate import Summary, source_of

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

MAX_CONNECTIONS = 16
PER_SOURCE = 8
MAX_REQUEST = 8 * 1024
TIMEOUT = 5.0


class _Capped(io.BufferedIOBase):
    """A request's input: at most `left` bytes, then end of file."""

    def __init__(self, inner: Any, left: int) -> None:
        self._inner = inner
        self._left = left

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> bytes:
        want = self._left if size is None or size < 0 else min(size, self._left)
        line = bytes(self._inner.readline(want)) if want > 0 else b""
        self._left -= len(line)
        return line

    def read(self, size: int | None = -1) -> bytes:
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = bytes(self._inner.read(want)) if want > 0 else b""
        self._left -= len(data)
        return data


class _Handler(WSGIRequestHandler):
    timeout = TIMEOUT  # StreamRequestHandler: a socket timeout on every read

    def setup(self) -> None:
        super().setup()
        self.rfile = _Capped(self.rfile, MAX_REQUEST)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing a peer sent reaches the log."""

    def log_error(self, format: str, *args: Any) -> None:
        """Nor what went wrong with it."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.summary = Summary("metrics")
        self._lock = threading.Lock()
        self._sources: Counter[str] = Counter()
        self._busy = 0
        self._held: dict[Any, str] = {}  # each request's socket: its source
        super().__init__(*args, **kwargs)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        source = source_of(client_address)
        with self._lock:
            if self._busy >= MAX_CONNECTIONS:
                self.summary.count(f"dropped over {MAX_CONNECTIONS} at once")
                return False
            if self._sources[source] >= PER_SOURCE:
                self.summary.count(f"dropped over {PER_SOURCE} from one address")
                return False
            self._busy += 1
            self._sources[source] += 1
            self._held[request] = source
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            source = self._held.pop(request, None)
            if source is not None:
                self._busy -= 1
                self._sources[source] -= 1
                if self._sources[source] <= 0:
                    del self._sources[source]
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.summary.count("failed requests")  # never a traceback on stderr


def start(host: str, port: int, registry: CollectorRegistry) -> tuple[_Server, threading.Thread]:
    """Serve `registry` at http://host:port/metrics in a daemon thread."""
    from prometheus_client import make_wsgi_app

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family[0]

    server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
