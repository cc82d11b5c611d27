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
from srtr.backends.agent.channel import AgentServer, Connection
from srtr.backends.agent.dial import Wire
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


def test_a_read_of_many_heartbeats_checks_one_tag_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle agent's socket, read once a round, holds many frames: one tag is computed
    (the newest's, whose number is the count of frames), not one per frame."""
    splitter = frames.Splitter(KEY, tls=True)
    wire = b"".join(frames.beat(KEY, n) for n in range(30))
    computed: list[int] = []
    tag = frames.beat_tag

    def counted(key: bytes, n: int) -> bytes:
        computed.append(n)
        return tag(key, n)

    monkeypatch.setattr(frames, "beat_tag", counted)
    assert splitter.feed(wire) == b""
    assert splitter.beats == 30 and computed == [29]


@pytest.mark.parametrize(
    "wire",
    [
        # the newest replaced by a forger's
        b"".join(frames.beat(KEY, n) for n in range(29)) + frames.beat(bytes(16), 29),
        # one slipped in among the agent's: the count, so the newest's number, is off
        b"".join(frames.beat(KEY, n) for n in range(15))
        + frames.beat(bytes(16), 0)
        + b"".join(frames.beat(KEY, n) for n in range(15, 30)),
        # one of the agent's dropped (the newest's number is off the other way)
        b"".join(frames.beat(KEY, n) for n in range(30) if n != 7),
        # the newest replayed
        b"".join(frames.beat(KEY, n) for n in range(30)) + frames.beat(KEY, 29),
    ],
)
def test_a_wrong_newest_tag_among_many_is_refused(wire: bytes) -> None:
    with pytest.raises(frames.ForgedBeat):
        frames.Splitter(KEY, tls=True).feed(wire)


def test_frames_cut_mid_frame_are_still_checked_whole() -> None:
    splitter = frames.Splitter(KEY, tls=True)
    wire = b"".join(frames.beat(KEY, n) for n in range(10))
    assert splitter.feed(wire[:40]) == b""  # 4 frames and the start of a 5th
    assert splitter.feed(wire[40:]) == b""
    assert splitter.beats == 10
    with pytest.raises(frames.ForgedBeat):
        splitter.feed(frames.beat(KEY, 3))


class _Handler:
    def __init__(self) -> None:
        self.conns: list[Connection] = []
        self.ends: list[tuple[str, bool]] = []
        self.messages: list[tuple[Connection, p.Message]] = []

    def connected(self, conn: Connection) -> None:
        self.conns.append(conn)

    def received(self, conn: Connection, message: p.Message) -> None:
        self.messages.append((conn, message))

    def gone(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        self.ends.append((why, silent))

    def refuse(self, node: str) -> str | None:
        return None

    def awaiting(self) -> bool:
        return False


async def _admitted(
    server: AgentServer, node: str = "node1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """An agent's connection, through the handshake: its streams and its heartbeat key."""
    assert server.address is not None
    reader, writer = await asyncio.open_connection(*server.address)
    challenge = p.decode(await reader.readline())
    assert isinstance(challenge, p.Challenge)
    proof = p.proof("token", "agent", challenge.nonce, node)
    writer.write(p.encode(p.Hello(node=node, pid=1, nonce="n", proof=proof)))
    welcome = p.decode(await reader.readline())
    assert isinstance(welcome, p.Welcome) and len(welcome.beat_key) == 2 * frames.KEY
    return reader, writer, bytes.fromhex(welcome.beat_key)


def test_a_forged_heartbeat_ends_the_connection_as_a_lost_nodes() -> None:
    """A peer on the path that slips a heartbeat into an agent's stream (it cannot know the
    session's key) does not keep a dead node alive: the connection ends as a silent one
    (reset: its lease stops being acknowledged), the node is lost."""

    async def main() -> None:
        handler = _Handler()
        server = AgentServer("token", handler, heartbeat=0.2, read_period=0.3)
        await server.start("127.0.0.1")
        _, writer, key = await _admitted(server)
        try:
            writer.write(frames.beat(key, 0))

            # A forger's heartbeats each second (here faster): the watcher reads the
            # connection once a round, and checks the newest tag.
            async def forge() -> None:
                while True:
                    await asyncio.sleep(0.15)
                    writer.write(frames.beat(secrets.token_bytes(16), 1))

            forger = asyncio.create_task(forge())
            await wait_for(lambda: handler.ends, within=10, what="the connection's end")
            forger.cancel()
            why, silent = handler.ends[0]
            assert silent and "forged heartbeat" in why, why
        finally:
            writer.close()
            await server.close()

    asyncio.run(main())


def test_a_message_without_its_doorbell_is_found_and_its_connection_read_at_every_arrival() -> None:
    """The urgent flag cleared on the path: a message arrives as plain bytes, which wake
    nothing. The watcher's read finds it, and from then on reads that connection whenever
    bytes arrive on it, not once a round; the others stay on their round."""

    async def main() -> None:
        handler = _Handler()
        server = AgentServer("token", handler, heartbeat=0.2, read_period=0.3)
        await server.start("127.0.0.1")
        _, quiet, _ = await _admitted(server, "node2")  # heartbeats with their doorbells
        _, writer, key = await _admitted(server)
        try:
            await wait_for(lambda: len(handler.conns) == 2, within=10, what="two agents")
            writer.write(frames.beat(key, 0) + p.encode(p.Bye()) + frames.beat(key, 1))
            await wait_for(lambda: handler.messages, within=10, what="the bell-less message")
            conn, message = handler.messages[0]
            assert conn.node == "node1" and isinstance(message, p.Bye)
            assert conn.beats == 2
            agents = {a.conn.node: a for a in server.beats._owners.values() if a.conn}
            assert server.beats.reads_always(agents["node1"].fd)
            assert not server.beats.reads_always(agents["node2"].fd)
        finally:
            writer.close()
            quiet.close()
            await server.close()

    asyncio.run(main())


def test_an_agent_whose_heartbeats_come_with_its_messages_is_not_silent() -> None:
    """While a launch is awaited, a message is read as its doorbell rings, and with it the
    heartbeat just before it: gone before the watcher's next look, which (edge-triggered)
    then reports nothing on that socket. The read counts as hearing the agent, or a node
    that answers every second would be lost as silent (as 257 of 4,000 hollow nodes were
    in a launch)."""

    async def main() -> None:
        handler = _Handler()
        handler.awaiting = lambda: True  # type: ignore[method-assign]
        server = AgentServer("token", handler, heartbeat=0.2, silence=0.5, read_period=60)
        await server.start("127.0.0.1")
        _, writer, key = await _admitted(server)
        wire = Wire(writer, key.hex())
        try:
            await wait_for(lambda: handler.conns, within=10, what="the agent")
            conn = handler.conns[0]
            # Each period a heartbeat, then a message and its doorbell, for 6 silences.
            for _ in range(30):
                wire.beat()
                writer.write(p.encode(p.Bye()))
                wire.ring()
                await asyncio.sleep(0.1)
            await wait_for(
                lambda: len(handler.messages) == 30 or handler.ends, within=10, what="the messages"
            )
            assert handler.ends == [] and not conn.gone
            assert conn.beats == 30
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


def test_a_frozen_agents_bytes_read_later_do_not_count_as_hearing_it_later() -> None:
    """A node that froze (silent, its connection open) left heartbeats unread; the watcher's
    read of them comes later (once a round). They count as heard when they came, not at the
    read, or the node's loss comes up to a silence late (4.3 s, not 2.6, at 10,000 hollow
    nodes)."""

    async def main() -> None:
        handler = _Handler()
        server = AgentServer("token", handler, heartbeat=0.5, read_period=3600)
        await server.start("127.0.0.1")
        _, writer, key = await _admitted(server)
        try:
            await wait_for(lambda: handler.conns, within=10, what="the agent")
            conn = handler.conns[0]
            beats = server.beats
            # Its round (the first: look 1 of 14,400) is past: no look reads it here.
            await wait_for(lambda: beats._looks >= 2, within=10, what="its round")
            looks = beats._looks
            writer.write(frames.beat(key, 0))  # its last heartbeat: then it froze
            await wait_for(lambda: beats._looks >= looks + 2, within=10, what="a look after")
            heard = conn.last_seen  # the look that saw it arrive
            await wait_for(lambda: beats._looks >= looks + 6, within=10, what="4 more looks")
            (agent,) = beats._owners.values()
            assert conn.beats == 0
            server._read([agent.fd])  # its round
            assert conn.beats == 1
            # Heard at that look, or the one after (the arrival's estimate is kept late by
            # the kernel's tick), not at the read, 4 looks later.
            assert conn.last_seen < heard + 1.5 * server.period
        finally:
            writer.close()
            await server.close()

    asyncio.run(main())
