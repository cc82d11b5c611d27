"""The agent channel is TLS: encrypted on the wire, the controller's certificate pinned by the
agent, the fingerprint in the agent's environment only (issue 22, part 6).

The controller's end decrypts from raw bytes (`tls_bytes.TlsBytes`, so the batch reader of
`coalesced` still reads raw fds); the agent's end is asyncio's TLS with a pin (`srtr.net.tls`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.agent.channel import AgentServer, Connection
from srtr.backends.agent.node import EXIT_AUTH, Agent
from srtr.backends.base import ObservationKind
from srtr.net import certs, tls
from tests.backends.agent.test_backend import Harness, _alive, run
from tests.support.e2e_util import cmdlines_with
from tests.support.e2e_util import wait_for_async as wait_for

TOKEN = "t0ken-for-the-test"
NODE = "node-with-a-findable-name"


class Recorder:
    """A Handler that remembers who connected and what they said."""

    def __init__(self) -> None:
        self.conns: list[Connection] = []
        self.messages: list[p.Message] = []

    def connected(self, conn: Connection) -> None:
        self.conns.append(conn)

    def received(self, conn: Connection, message: p.Message) -> None:
        self.messages.append(message)

    def gone(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        return None

    def refuse(self, node: str) -> str | None:
        return None

    def awaiting(self) -> bool:
        return False


class Tap:
    """A TCP relay in front of the server that keeps every byte it passes, both ways."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                self.seen += data
                dst.write(data)
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def session(
    tmp_path: Path, *, encrypted: bool, pin: str | None = None
) -> tuple[int, Tap, Recorder]:
    """An agent joins through a Tap; the controller sends it one Signal. (agent's exit code,
    or -1 while it still runs, the tap, the handler)."""
    cert = certs.for_job(tmp_path)
    handler = Recorder()
    server = AgentServer(TOKEN, handler, tls=cert.server_context() if encrypted else None)
    address = await server.start("127.0.0.1")
    tap = Tap(address)
    port = await tap.start()
    fingerprint = (pin or cert.fingerprint) if encrypted else None
    agent = Agent(NODE, TOKEN, inherit_all=False, fingerprint=fingerprint)
    task = asyncio.create_task(agent.run("127.0.0.1", port))
    try:
        await wait_for(lambda: handler.conns or task.done(), 20, "the agent to join or fail")
        if handler.conns:
            before = len(tap.seen)
            handler.conns[0].send(p.Signal(name="instance-with-a-findable-name", signum=15))
            await wait_for(lambda: len(tap.seen) > before, 10, "the signal through the tap")
        code = task.result() if task.done() else -1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.close()
        tap.close()
    return code, tap, handler


def test_in_the_clear_a_tap_reads_everything(tmp_path: Path) -> None:
    """The control for the next test: without TLS the tap sees names and messages."""
    _, tap, handler = asyncio.run(session(tmp_path, encrypted=False))
    assert [c.node for c in handler.conns] == [NODE]
    assert NODE.encode() in tap.seen and b'"type":"challenge"' in tap.seen


def test_with_tls_a_tap_reads_nothing_and_the_agent_still_joins(tmp_path: Path) -> None:
    code, tap, handler = asyncio.run(session(tmp_path, encrypted=True))
    assert code == -1 and [c.node for c in handler.conns] == [NODE]
    assert tap.seen[:1] == b"\x16"  # a TLS handshake record
    for clear in (NODE.encode(), b"challenge", b"hello", b"instance-with-a-findable-name"):
        assert clear not in tap.seen


def test_an_agent_hangs_up_on_a_controller_with_another_certificate(tmp_path: Path) -> None:
    """A server with the token but not the job's key (a stale controller's port reused, a
    man in the middle): the agent never says hello and exits with the auth code."""
    other = certs.create(tmp_path / "other.crt", tmp_path / "other.key")
    code, _, handler = asyncio.run(session(tmp_path, encrypted=True, pin=other.fingerprint))
    assert code == EXIT_AUTH and handler.conns == []


def test_the_fingerprint_travels_in_the_environment_and_stops_at_the_agent(
    tmp_path: Path,
) -> None:
    """Real agent processes on a TLS channel: instances run; the fingerprint is in no argv
    and in no instance's environment; an agent given another one is refused (exit 3)."""

    async def body(h: Harness) -> None:
        assert h.cert is not None
        await h.launch("env", ["bash", "-c", "env; exit 0"])
        assert (await h.wait_seen("env", ObservationKind.EXITED)).exit_code == 0
        assert tls.FINGERPRINT_ENV not in h.log("env") and h.cert.fingerprint not in h.log("env")
        assert cmdlines_with(h.cert.fingerprint) == [] and cmdlines_with(h.token) == []
        address = h.backend.address
        assert address is not None
        env = {**os.environ, p.TOKEN_ENV: h.token, tls.FINGERPRINT_ENV: "sha256:" + "0" * 64}
        argv = [sys.executable, "-m", "srtr.backends.agent.node"]
        argv += ["--controller", f"{address[0]}:{address[1]}", "--node", "node2"]
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == EXIT_AUTH, done.stderr
        assert "not our controller" in done.stderr

    run(tmp_path, body, tls=True)


def test_over_tls_the_agent_keeps_its_lease_and_its_work(tmp_path: Path) -> None:
    """With the channel in TLS, the heartbeats go encrypted on the agent's one connection
    and their acknowledgement keeps the lease: an agent heard for longer than its lease never
    fences. (A merge once dropped the heartbeat count on the TLS path: every agent on SLURM
    fenced 5 s after it joined.)"""

    async def body(h: Harness) -> None:
        pid = await h.launch("worker", ["sleep", "1000"], stop_grace_seconds=1.0)
        server = h.backend._server
        assert server is not None

        def heard_past_the_lease() -> bool:
            # Heartbeats come once a second: 4 of them span more than the 2.5 s lease.
            return all(c.beats >= 4 for c in server.connections())

        await wait_for(heard_past_the_lease, 15, "heartbeats past the lease")
        assert _alive(pid)
        log = (h.run_dir / "logs" / "agent-node1.log").read_text()
        assert "no word from the controller" not in log, log

    run(tmp_path, body, node_count=1, lease=2.5, tls=True)
