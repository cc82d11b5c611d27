"""The control channel of a running job: TLS over TCP from any host, and a same-host socket.

`srtr up` serves it; `srtr down`, `srtr tui RUN_DIR`, the TUI's keys and tests send intents
through it. One JSON object per line each way: `{"op": "restart", "instance":
"service_x_node2"}` → `{"ok": true, "message": "restarting service_x_node2"}`. Ops are those
of `controllers.intents`.

Like a kube-apiserver's, the channel's address and credential are in a file: `control.json`
in the run dir (mode 0600, in the 0700 run dir), which holds the addresses it listens on
(`HOST:PORT`, the address on the route to the nodes first, then the host name), a token made
for this controller, and the SHA-256 fingerprint of the job's certificate (`certs`). It
listens on every address, so the nodes and a login host can reach it. A client:

1. connects to each address in turn, speaks TLS 1.3 and pins the fingerprint (`srtr.net.tls`):
   a server without the job's key is dropped before anything is sent;
2. reads the server's challenge `{"challenge": nonce}` and sends its request with
   `"proof": HMAC-SHA256(token, "control\\n" + nonce)`: only who can read `control.json`
   can drive the job, and the token never crosses the wire;
3. reads the answer.

The Unix socket `control.sock` (0600) stays as a fast path on the controller's own host,
in the run dir only: when the run dir's path is too long for a socket address (108 bytes)
there is none, and the TCP channel is the only way in. From another host a socket file seen
over NFS refuses connections, and the client goes on to TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srtr.net import tls

SOCKET_NAME = "control.sock"
CONTROL_FILE = "control.json"
LISTEN_HOST = "0.0.0.0"  # every address: the nodes and a login host must reach it
CONNECT_TIMEOUT = 2.0  # per address: a dead address must not eat the whole budget
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin
_MAX_REQUEST = 64 * 1024
_HANDSHAKE_TIMEOUT = 5.0


class ControlError(Exception):
    """The job could not be reached, or refused the intent; the message says which."""


class Unreachable(ControlError):
    """No controller answered: none runs, or none can be reached from here."""


def socket_path(run_dir: Path) -> Path | None:
    """The fast path's socket in the run dir, or None when its path does not fit."""
    path = run_dir.resolve() / SOCKET_NAME
    return path if len(str(path)) <= _MAX_SOCKET_PATH else None


def proof(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"control\n{nonce}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Credentials:
    """control.json: where the controller listens and how to prove we may drive it."""

    addresses: list[str]
    token: str
    fingerprint: str
    socket: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "addresses": self.addresses,
                "token": self.token,
                "fingerprint": self.fingerprint,
                "socket": self.socket,
            }
        )


def read_credentials(run_dir: Path) -> Credentials | None:
    """`run_dir`'s control.json, or None when there is none (no controller runs there) or it
    cannot be read (another user's run dir)."""
    try:
        doc = json.loads((run_dir / CONTROL_FILE).read_text(encoding="utf-8"))
        return Credentials(
            addresses=[str(a) for a in doc["addresses"]],
            token=str(doc["token"]),
            fingerprint=str(doc["fingerprint"]),
            socket=doc.get("socket"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def advertised_hosts(node_ips: Sequence[str]) -> list[str]:
    """The addresses of this machine to write into control.json, best first: the one on the
    route to the first node (what the nodes, and hosts on their network, dial), then the
    host name (what a login host may resolve)."""
    hosts = []
    for ip in node_ips[:1]:
        with contextlib.suppress(OSError):
            hosts.append(route_source(ip))
    hosts.append(socket.gethostname())
    return list(dict.fromkeys(hosts))


def route_source(ip: str) -> str:
    """The address of this machine on the route to `ip`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # UDP: no packet is sent; the kernel only picks a route
        return str(probe.getsockname()[0])


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


Handler = Callable[[str, str | None, str | None], str]


class ControlServer:
    """Serves intents to `handler(op, instance, node) -> message`; handler raises to refuse.

    `context` is the TLS server context of the job's certificate, whose fingerprint is
    `fingerprint`; `hosts` are the addresses written into control.json (`advertised_hosts`).
    """

    def __init__(
        self,
        run_dir: Path,
        handler: Handler,
        refusal: type[Exception],
        *,
        context: ssl.SSLContext,
        fingerprint: str,
        hosts: Sequence[str],
        listen: str = LISTEN_HOST,
    ) -> None:
        self.run_dir = run_dir
        self.path = socket_path(run_dir)
        self._handler = handler
        self._refusal = refusal
        self._context = context
        self._fingerprint = fingerprint
        self._hosts = list(hosts)
        self._listen = listen
        self._token = secrets.token_urlsafe(32)
        self._unix: asyncio.AbstractServer | None = None
        self._tcp: asyncio.AbstractServer | None = None
        self.addresses: list[str] = []

    async def start(self) -> None:
        self._tcp = await asyncio.start_server(
            self._serve_tcp, self._listen, 0, ssl=self._context, limit=_MAX_REQUEST
        )
        port = int(self._tcp.sockets[0].getsockname()[1])
        self.addresses = [_join(host, port) for host in self._hosts]
        await self._start_unix()
        self._write_credentials()

    async def _start_unix(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            self._unix = await asyncio.start_unix_server(self._serve_unix, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def _write_credentials(self) -> None:
        credentials = Credentials(
            addresses=self.addresses,
            token=self._token,
            fingerprint=self._fingerprint,
            socket=str(self.path) if self.path is not None else None,
        )
        tls.write_private(self.run_dir / CONTROL_FILE, (credentials.to_json() + "\n").encode())

    async def reopen(self) -> None:
        """Write control.json and listen at the socket again, if they are gone (the run dir
        was removed and recreated). The TCP listener never went away."""
        if not (self.run_dir / CONTROL_FILE).exists():
            self._write_credentials()
        if self.path is None or self.path.exists():
            return
        if self._unix is not None:
            self._unix.close()
        await self._start_unix()

    async def close(self) -> None:
        for server in (self._tcp, self._unix):
            if server is not None:
                server.close()
        for server in (self._tcp, self._unix):
            if server is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2.0):
                        await server.wait_closed()
        # The token dies with this controller: nobody should try it again.
        with contextlib.suppress(OSError):
            (self.run_dir / CONTROL_FILE).unlink()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _serve_unix(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The same-host socket: its 0600 mode is the authentication."""
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=_HANDSHAKE_TIMEOUT)
            await self._reply(writer, self._answer(line[:_MAX_REQUEST]))
        except (TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            await _close(writer)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """TLS (asyncio did the handshake): a challenge, then a request with its proof."""
        nonce = secrets.token_hex(16)
        try:
            writer.write((json.dumps({"challenge": nonce}) + "\n").encode())
            line = await asyncio.wait_for(reader.readline(), timeout=_HANDSHAKE_TIMEOUT)
            try:
                given = json.loads(line).get("proof")
            except (ValueError, AttributeError):
                given = None
            if not isinstance(given, str) or not hmac.compare_digest(
                given, proof(self._token, nonce)
            ):
                await self._reply(writer, {"ok": False, "message": "wrong credential"})
                return
            await self._reply(writer, self._answer(line))
        except (TimeoutError, ConnectionError, ValueError, ssl.SSLError):
            pass
        finally:
            await _close(writer)

    async def _reply(self, writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
        writer.write((json.dumps(reply) + "\n").encode())
        await writer.drain()

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "message": "requests are one JSON object per line"}
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return {"ok": False, "message": 'a request needs an "op"'}
        instance, node = request.get("instance"), request.get("node")
        for key, value in (("instance", instance), ("node", node)):
            if value is not None and not isinstance(value, str):
                return {"ok": False, "message": f'"{key}" must be a string'}
        try:
            return {"ok": True, "message": self._handler(request["op"], instance, node)}
        except self._refusal as exc:
            return {"ok": False, "message": str(exc)}


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()


def send(
    run_dir: Path,
    op: str,
    instance: str | None = None,
    timeout: float = 5.0,
    *,
    node: str | None = None,
) -> str:
    """Send one intent to the job of `run_dir`; return its message.

    Raises:
        Unreachable: no controller answered (none runs, or none is reachable from here).
        ControlError: the job refused the intent.
    """
    request: dict[str, Any] = {
        "op": op,
        **({"instance": instance} if instance else {}),
        **({"node": node} if node else {}),
    }
    credentials = read_credentials(run_dir)
    if credentials is None:
        raise Unreachable(f"the job of {run_dir} is not running (no {CONTROL_FILE})")
    deadline = time.monotonic() + timeout
    reply = _send_unix(credentials, request, timeout)
    if reply is None:
        reply = _send_tcp(run_dir, credentials, request, deadline)
    if not reply.get("ok"):
        raise ControlError(str(reply.get("message", "refused")))
    return str(reply.get("message", ""))


def _send_unix(
    credentials: Credentials, request: dict[str, Any], timeout: float
) -> dict[str, Any] | None:
    """The same-host fast path; None when it is not there (another host, no socket)."""
    if not credentials.socket:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(credentials.socket)
            sock.sendall((json.dumps(request) + "\n").encode())
            return _read_reply(sock)
    except OSError:
        return None  # refused (a socket seen over NFS, a dead controller's), missing, ...


def _send_tcp(
    run_dir: Path, credentials: Credentials, request: dict[str, Any], deadline: float
) -> dict[str, Any]:
    failures = []
    context = tls.client_context()
    for address in credentials.addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            failures.append(f"{address}: out of time")
            break
        try:
            host, port = _split(address)
            with (
                socket.create_connection((host, port), timeout=min(CONNECT_TIMEOUT, left)) as raw,
                context.wrap_socket(raw) as sock,
            ):
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                tls.check_pin(sock.getpeercert(binary_form=True), credentials.fingerprint)
                challenge = json.loads(_read_line(sock))
                signed = {**request, "proof": proof(credentials.token, str(challenge["challenge"]))}
                sock.sendall((json.dumps(signed) + "\n").encode())
                return _read_reply(sock)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # ssl.SSLError is an OSError
            failures.append(f"{address}: {exc}")
    raise Unreachable(f"cannot reach the controller of {run_dir} ({'; '.join(failures)})")


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _read_reply(sock: socket.socket) -> dict[str, Any]:
    data = _read_line(sock)
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError("the job sent no answer") from None
    if not isinstance(reply, dict):
        raise ControlError("the job sent no answer")
    return reply
