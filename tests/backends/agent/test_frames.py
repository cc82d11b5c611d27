"""One connection per agent: heartbeat frames and doorbells between the stream's records
(`frames`), and the controller's end of them (`channel`): a heartbeat never wakes the loop, a
message does, and a forged heartbeat ends the connection as a lost node's.

Real sockets on a real event loop; no clock is faked."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from srtr.backends.agent import frames
from srtr.backends.agent import protocol as p
from srtr.backends.agent.channel import READ_EVERY, AgentServer, Connection
from srtr.backends.base import ObservationKind
from tests.backends.agent.test_backend import Harness, run
from tests.support.e2e_util import wait_for_async as wait_for

KEY = bytes(range(16))


def _record(body: bytes) -> bytes:
    """A TLS application-data record's bytes (header and an opaque body)."""
    return b"\x17\x03\x03" + len(body).to_bytes(2, "big") + body


def test_frames_and_inline_doorbells_leave_the_tls_stream_whole_however_it_is_cut() -> None:
    # Record bodies that hold the frames' marker bytes: only boundaries are looked at.
    one, two = _record(b"\x00\x01" * 20), _record(bytes(300))
    wire = (
        frames.beat(KEY, 0)
        + one
        + bytes((frames.BELL,))
        + frames.beat(KEY, 1)
        + two
        + frames.beat(KEY, 2)
    )
    for cut in (1, 2, 5, 7, 9, 10, len(wire)):
        splitter = frames.Splitter(KEY, tls=True)
        stream = b"".join(splitter.feed(wire[i : i + cut]) for i in range(0, len(wire), cut))
        assert stream == one + two, cut
        assert splitter.beats == 3


def test_in_the_clear_frames_sit_between_lines() -> None:
    splitter = frames.Splitter(KEY, tls=False)
    wire = b'{"type":"bye"}\n' + frames.beat(KEY, 0) + b"\n" + bytes((frames.BELL,)) + b'{"a":'
    assert splitter.feed(wire) == b'{"type":"bye"}\n\n{"a":'
    assert splitter.feed(b"1}\n" + frames.beat(KEY, 1)) == b"1}\n"
    assert splitter.beats == 2


@pytest.mark.parametrize(
    "wrong",
    [
        frames.beat(bytes(16), 0),  # another key
        frames.beat(KEY, 1),  # skipped ahead
        frames.beat(KEY, 0) + frames.beat(KEY, 0),  # replayed
    ],
)
def test_a_heartbeat_with_a_wrong_tag_is_refused(wrong: bytes) -> None:
    splitter = frames.Splitter(KEY, tls=True)
    with pytest.raises(frames.ForgedBeat):
        splitter.feed(wrong)


class _Handler:
    def __init__(self) -> None:
        self.conns: list[Connection] = []
        self.ends: list[tuple[str, bool]] = []

    def connected(self, conn: Connection) -> None:
        self.conns.append(conn)

    def received(self, conn: Connection, message: p.Message) -> None: ...

    def gone(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        self.ends.append((why, silent))

    def refuse(self, node: str) -> str | None:
        return None

    def awaiting(self) -> bool:
        return False


def test_a_forged_heartbeat_ends_the_connection_as_a_lost_nodes() -> None:
    """A peer on the path that slips a heartbeat into an agent's stream (it cannot know the
    session's key) does not keep a dead node alive: the connection ends as a silent one
    (reset: its lease stops being acknowledged), the node is lost."""

    async def main() -> None:
        handler = _Handler()
        server = AgentServer("token", handler, heartbeat=0.2)
        host, port = await server.start("127.0.0.1")
        reader, writer = await asyncio.open_connection(host, port)
        try:
            challenge = p.decode(await reader.readline())
            assert isinstance(challenge, p.Challenge)
            proof = p.proof("token", "agent", challenge.nonce, "node1")
            writer.write(p.encode(p.Hello(node="node1", pid=1, nonce="n", proof=proof)))
            welcome = p.decode(await reader.readline())
            assert isinstance(welcome, p.Welcome) and len(welcome.beat_key) == 2 * frames.KEY
            key = bytes.fromhex(welcome.beat_key)
            writer.write(frames.beat(key, 0))
            # Arrivals the watcher sees one by one, as a forger's heartbeats each second: it
            # reads the connection after a few and checks their tags.
            for _ in range(2 * READ_EVERY):
                await asyncio.sleep(0.15)
                writer.write(frames.beat(secrets.token_bytes(16), 1))
            await wait_for(lambda: handler.ends, within=10, what="the connection's end")
            why, silent = handler.ends[0]
            assert silent and "forged heartbeat" in why, why
        finally:
            writer.close()
            await server.close()

    asyncio.run(main())


def test_heartbeats_never_wake_the_controllers_loop_and_a_message_does(tmp_path: Path) -> None:
    """The agents' sockets wake the batch reader for a message's doorbell only: while an
    agent only beats, no batch is read, yet its heartbeats are counted (and their tags
    checked) when the watcher reads it; an exit then arrives through a batch."""

    async def body(h: Harness) -> None:
        await h.launch("sleeper", ["sleep", "1000"])
        server = h.backend._server
        assert server is not None
        await wait_for(lambda: all(c.beats >= 1 for c in server.connections()), 15, "beats")
        batches = server.reader.batches
        seen = min(c.beats for c in server.connections())
        await wait_for(lambda: all(c.beats > seen for c in server.connections()), 15, "more beats")
        assert server.reader.batches == batches
        await h.backend.signal("sleeper", 9)
        await h.wait_seen("sleeper", ObservationKind.EXITED)
        assert server.reader.batches > batches

    run(tmp_path, body, tls=True)
