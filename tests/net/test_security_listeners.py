"""What another local user, without the job's credentials, can cost its listeners.

Each test runs the listener as the job would (the agent channel with the job's TLS
certificate, the control port, the metrics endpoint) and attacks it from a process of
another user (`security_util.Attacker`): its memory stays bounded, unproved connections are
closed within the deadline and capped, its log carries none of the peer's text and no
traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from srtr.backends.agent import channel
from srtr.backends.agent import protocol as p
from srtr.net import certs, listen_gate
from tests.support.control_util import loopback_control
from tests.support.e2e_util import wait_for_async
from tests.support.security_util import Attacker, attacker  # noqa: F401 - the fixture

MARKER = "EVIL\x1b]0;pwned\x07\nFORGED srtr: everything is fine"

# The controller of these tests: the agent channel with a job certificate, in a process of
# its own so that its memory is its own; it prints its ports, then its peak RSS on request.
CONTROLLER = """
import asyncio, sys
from pathlib import Path
from srtr.net import certs
from srtr.backends.agent.channel import AgentServer

class Refuse:
    def connected(self, conn): pass
    def received(self, conn, message): pass
    def gone(self, conn, why, *, silent=False): pass
    def refuse(self, node): return None
    def awaiting(self): return False

async def main():
    cert = certs.create(Path(sys.argv[1]) / "job.crt", Path(sys.argv[1]) / "job.key")
    server = AgentServer("job-token", Refuse(), tls=cert.server_context())
    host, port = await server.start("127.0.0.1")
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        # VmHWM: this process's own peak (ru_maxrss would count what it was forked from)
        status = Path("/proc/self/status").read_text()
        peak = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmHWM"))
        print(peak, sum(server.refusals().values()), flush=True)

asyncio.run(main())
"""

# 50 connections that each complete TLS (no pin: anyone can) and then send megabytes of a
# line that never ends; and 50 plain ones doing the same without TLS. Prints how many bytes
# got in before the controller hung up, and how many hung-up connections it saw.
FLOOD = """
import socket, ssl, sys, time
port, megabytes = int(sys.argv[1]), int(sys.argv[2])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
conns = []
for _ in range(50):
    raw = socket.create_connection(("127.0.0.1", port))
    conns.append(context.wrap_socket(raw))
    conns.append(socket.create_connection(("127.0.0.1", port)))
chunk = b"x" * 65536
sent = 0
hung_up = 0
for conn in conns:
    conn.settimeout(10)
    try:
        for _ in range(megabytes * 16):
            conn.sendall(chunk)
            sent += len(chunk)
    except OSError:
        hung_up += 1
print(sent, hung_up)
"""


def _rss_probe(controller: subprocess.Popen[str]) -> tuple[int, int]:
    assert controller.stdin is not None and controller.stdout is not None
    controller.stdin.write("\n")
    controller.stdin.flush()
    peak, refused = controller.stdout.readline().split()
    return int(peak), int(refused)


def test_fifty_unproved_connections_sending_megabytes_cost_no_memory(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert controller.stdout is not None
        port = controller.stdout.readline().strip()
        before, _ = _rss_probe(controller)
        out = attacker.run(FLOOD, port, "4", timeout=180)
        sent, hung_up = (int(x) for x in out.split())
        after, refused = _rss_probe(controller)
    finally:
        controller.kill()
        controller.wait()
    # Every one of the 100 was hung up on (over the hello's limit): none was read to its end,
    # and the controller's peak grew by far less than what the 50 TLS peers alone tried to
    # send (200 MB; before the fix each could fill 16 MiB).
    assert hung_up == 100
    assert sent < 100 * 4 * 2**20
    assert after - before < 40 * 1024, f"peak RSS grew by {(after - before) // 1024} MiB"
    assert refused >= 100


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


class _Admit:
    def __init__(self) -> None:
        self.joined: list[str] = []

    def connected(self, conn: channel.Connection) -> None:
        self.joined.append(conn.node)

    def received(self, conn: channel.Connection, message: p.Message) -> None:
        return None

    def gone(self, conn: channel.Connection, why: str, *, silent: bool = False) -> None:
        return None

    def refuse(self, node: str) -> str | None:
        return None

    def awaiting(self) -> bool:
        return True


# Hostile hellos, none with the job's token: a forged node name with escapes and newlines,
# deep nesting (a RecursionError in json), a non-JSON line, a hello of the wrong types.
HOSTILE = """
import json, socket, ssl, sys
port, marker = int(sys.argv[1]), sys.argv[2]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
lines = [
    json.dumps({"type": "hello", "node": marker, "pid": 1, "nonce": "n", "proof": "0" * 64}),
    "[" * 20000,
    marker,
    json.dumps({"type": "hello", "node": {"x": marker}, "pid": marker, "nonce": 1, "proof": 2}),
    json.dumps({"type": marker}),
]
for line in lines:
    with socket.create_connection(("127.0.0.1", port)) as raw, context.wrap_socket(raw) as conn:
        conn.settimeout(10)
        conn.recv(4096)  # the challenge
        conn.sendall(line.encode("utf-8", "surrogateescape") + b"\\n")
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
print("done")
"""


def test_no_byte_of_an_unproved_peer_reaches_the_log(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert = certs.create(tmp_path / "job.crt", tmp_path / "job.key")
    handler = _Admit()

    async def body() -> dict[str, int]:
        server = channel.AgentServer("job-token", handler, tls=cert.server_context())
        _, port = await server.start("127.0.0.1")
        try:
            out = await asyncio.to_thread(attacker.run, HOSTILE, str(port), MARKER)
            assert out.strip() == "done"
            return server.refusals()
        finally:
            await server.close()

    with caplog.at_level(logging.DEBUG):
        refusals = _run(body())
    assert handler.joined == []
    assert sum(refusals.values()) == 5, refusals
    text = "\n".join(r.getMessage() for r in caplog.records)
    for fragment in ("EVIL", "pwned", "FORGED", "\x1b"):
        assert fragment not in text
    assert not any(r.exc_info for r in caplog.records)  # no traceback (RecursionError)
    # Refused connections are counted, not logged one by one: the first at once, the other
    # four together (at the interval's end, or here when the listener closes).
    assert sum("agents: in the last" in r.getMessage() for r in caplog.records) == 2


def test_an_idle_connection_is_closed_within_the_deadline(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle after TCP, idle in the middle of the TLS handshake: both closed by the deadline."""
    monkeypatch.setattr(channel, "PROOF_DEADLINE", 1.0)
    idle = """
        import socket, sys, time
        port = int(sys.argv[1])
        plain = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(bytes.fromhex("160301"))  # a TLS record header, and nothing more
        started = time.monotonic()
        for conn in (plain, half):
            conn.settimeout(30)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
        print(round(time.monotonic() - started))
    """
    cert = certs.create(tmp_path / "job.crt", tmp_path / "job.key")

    async def body() -> int:
        server = channel.AgentServer("job-token", _Admit(), tls=cert.server_context())
        _, port = await server.start("127.0.0.1")
        try:
            out = await asyncio.to_thread(attacker.run, idle, str(port))
            return int(out)
        finally:
            await server.close()

    # Both were closed by the controller (the attacker's own timeout is 30 s per socket).
    assert _run(body()) < 30


def test_unproved_connections_are_capped_per_address_and_the_rest_wait() -> None:
    """The gate alone: over `per_source` from one address is dropped at once; at
    `max_pending` it stops accepting and the next waits in the backlog until a slot frees."""

    async def body() -> tuple[int, int, int]:
        served: list[listen_gate.Ticket] = []
        sock = listen_gate.listen("127.0.0.1", backlog=64)
        limits = listen_gate.Limits(max_pending=4, per_source=3, deadline=30.0)
        gate = listen_gate.Gate("test", sock, lambda conn, t: served.append(t), limits)
        clients = []
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", gate.port)
            clients.append(writer)
        await wait_for_async(lambda: gate.summary.total.total() >= 2, what="two drops")
        dropped = gate.summary.total.total()
        held = len(served)
        served[0].proved()  # a slot frees: nothing more from loopback while 2 more wait
        await asyncio.sleep(0.05)
        gate.close()
        for writer in clients:
            writer.close()
        return held, dropped, gate.pending

    held, dropped, pending = _run(body())
    assert held == 3 and dropped == 2 and pending == 2


def test_admitted_connections_send_without_waiting_for_an_ack() -> None:
    """TCP_NODELAY on what the gate admits, as asyncio's own servers have it: without it
    each reply of a request-answer exchange waited for the peer's delayed ACK."""

    async def body() -> int:
        served: list[Any] = []
        sock = listen_gate.listen("127.0.0.1", backlog=8)
        limits = listen_gate.Limits(max_pending=4, per_source=4, deadline=30.0)
        gate = listen_gate.Gate("test", sock, lambda conn, t: served.append(conn), limits)
        _, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        await wait_for_async(lambda: served, what="a connection admitted")
        nodelay = int(served[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        gate.close()
        writer.close()
        served[0].close()
        return nodelay

    assert _run(body()) == 1


def test_loopback_addresses_count_as_one_source() -> None:
    assert listen_gate.source_of(("127.0.0.1", 1)) == listen_gate.source_of(("127.9.9.9", 2))
    assert listen_gate.source_of(("::ffff:127.0.0.5", 1, 0, 0)) == "loopback"
    assert listen_gate.source_of(("10.0.0.1", 1)) == "10.0.0.1"


def test_an_accept_that_fails_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EMFILE from accept (a descriptor flood): one line, no traceback, accepting resumes."""

    class Failing:
        def __init__(self, sock: Any) -> None:
            self.sock = sock
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

        def accept(self) -> Any:
            self.calls += 1
            raise OSError(24, "Too many open files")

    async def body() -> int:
        sock = Failing(listen_gate.listen("127.0.0.1", backlog=8))
        limits = listen_gate.Limits(max_pending=4, per_source=4, deadline=5.0)
        gate = listen_gate.Gate("test", sock, lambda conn, t: None, limits)  # type: ignore[arg-type]
        for _ in range(3):
            gate._accept()
        gate.close()
        return sock.calls

    with caplog.at_level(logging.WARNING):
        assert _run(body()) == 3
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


def test_the_control_port_refuses_hostile_requests_without_a_traceback(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:

    cert = certs.create(tmp_path / "job.crt", tmp_path / "job.key")
    hostile = """
        import socket, ssl, sys
        port = int(sys.argv[1])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        answers = []
        for line in (b"[" * 3000, b'{"op": "down", "proof": "00"}', b"x" * 200000):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                with context.wrap_socket(raw) as conn:
                    conn.settimeout(10)
                    conn.recv(4096)
                    try:
                        conn.sendall(line + b"\\n")
                        answers.append(conn.recv(4096).decode().strip() or "closed")
                    except OSError:
                        answers.append("closed")
        print("|".join(answers))
    """
    calls: list[str] = []

    def handler(op: str, instance: str | None, node: str | None) -> str:
        calls.append(op)
        return "ok"

    async def body() -> str:
        async with loopback_control(tmp_path, handler, cert) as server:
            port = int(server.addresses[0].rpartition(":")[2])
            return str(await asyncio.to_thread(attacker.run, hostile, str(port)))

    with caplog.at_level(logging.DEBUG):
        out = _run(body())
    answers = out.strip().split("|")
    assert calls == []
    assert all("wrong credential" in a or a == "closed" for a in answers), answers
    assert not any(r.exc_info for r in caplog.records)


def test_metrics_bind_loopback_cap_connections_and_time_out(
    attacker: Attacker,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prometheus_client import CollectorRegistry

    from srtr.runtime import metrics, metrics_http

    assert metrics.parse_listen("9400") == ("127.0.0.1", 9400)
    monkeypatch.setattr(metrics_http._Handler, "timeout", 1.0)
    server, thread = metrics_http.start("127.0.0.1", 0, CollectorRegistry())
    port = server.server_port
    idle = """
        import socket, sys, time
        port = int(sys.argv[1])
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
        started = time.monotonic()
        closed = 0
        for conn in conns:
            conn.settimeout(20)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            closed += 1
        print(closed, round(time.monotonic() - started))
    """
    try:
        closed, seconds = (int(x) for x in attacker.run(idle, str(port)).split())
        # A real scrape still works afterwards.
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert closed == 60 and seconds < 20
    dropped = sum(n for what, n in server.summary.total.items() if "dropped" in what)
    assert dropped >= 60 - metrics_http.PER_SOURCE


def test_protocol_decode_refuses_deep_nesting() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(b"[" * 100000)


def test_shown_escapes_and_truncates() -> None:
    text = listen_gate.shown("a\x1b]0;x\x07\n" + "y" * 500)
    assert "\x1b" not in text and "\n" not in text and len(text) <= 120


def test_hello_limit_is_far_below_a_launch_line() -> None:
    assert channel.MAX_HELLO * channel.MAX_PENDING <= 32 * 2**20
    assert channel.MAX_HELLO < p.MAX_LINE // 100


@pytest.mark.parametrize(
    ("argv", "listen"),
    [
        (["--metrics-port", "9400"], ("127.0.0.1", 9400)),
        (["--metrics-port", "9400", "--metrics-address", "0.0.0.0"], ("0.0.0.0", 9400)),
        (["--metrics-address", "[::]", "--metrics-port", "10.1.2.3:9400"], ("::", 9400)),
        ([], None),
    ],
)
def test_metrics_address_chooses_the_interface(argv: list[str], listen: object) -> None:
    from srtr.cli import build_parser

    args, _ = build_parser().parse_known_args(["up", "r.yaml", *argv])
    assert args.metrics_port == listen
