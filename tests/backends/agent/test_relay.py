"""An agent's part in its relay group (`relay`): a member's datagrams (only while its lease
holds), a relay's check of their tags and numbers, and its records (on change, and a
keepalive). Real UDP sockets on loopback."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from srtr.backends.agent import protocol as p
from srtr.backends.agent import relay as relay_module
from srtr.backends.agent.relay import KEEPALIVE, STALE, Listening, Role, datagram

KEY = bytes(range(16))


def test_a_relay_counts_only_genuine_new_datagrams_of_its_members() -> None:
    async def main() -> None:
        relay = Listening(KEY, count=4, own=0, host="127.0.0.1")
        try:
            now = time.monotonic()
            assert relay.take(datagram(KEY, 2, 10), now)
            assert not relay.take(datagram(KEY, 2, 10), now)  # replayed
            assert not relay.take(datagram(KEY, 2, 9), now)  # older
            assert not relay.take(datagram(bytes(16), 3, 11), now)  # another key: forged
            assert not relay.take(datagram(KEY, 4, 11), now)  # not a member
            assert not relay.take(datagram(KEY, 1, 11)[:-1], now)  # cut short
            assert relay.missing(now, 1.0) == [1, 3]  # never its own index
            assert relay.missing(now + STALE + 0.1, 1.0) == [1, 2, 3]
        finally:
            relay.close()

    asyncio.run(main())


def test_a_member_tells_its_relay_while_its_lease_holds_and_the_relay_records_changes() -> None:
    async def main() -> None:
        posted: list[p.Message] = []
        sent: list[p.Message] = []
        relay = Role("r", sent.append, posted.append)
        member = Role("m", sent.append, posted.append)
        relay.handle(p.Relay(KEY.hex(), count=2, index=0), "127.0.0.1")
        assert relay.listening is not None
        port = relay.listening.port
        assert sent == [p.Relaying(port)]
        relay.beat(0.5)
        assert posted == [p.Relayed([1])]  # the member was never heard
        member.handle(p.RelayTo("127.0.0.1", port, KEY.hex(), 1), "127.0.0.1")
        listening = relay.listening
        member.beat(2.0)  # its newest acknowledged heartbeat went 2 periods ago: silent
        listening.read()  # (loopback: a datagram sent is queued at its socket at once)
        assert listening.missing(time.monotonic(), 1.0) == [1]
        member.beat(0.9)
        listening.read()
        assert listening.missing(time.monotonic(), 1.0) == []
        relay.beat(0.5)
        assert posted[-1] == p.Relayed([])
        for _ in range(KEEPALIVE - 1):  # nothing changes: no record ...
            relay.beat(0.5)
        assert len(posted) == 2
        relay.beat(0.5)  # ... but the keepalive
        assert posted[-1] == p.Relayed([]) and len(posted) == 3
        relay.reset()
        assert relay.listening is None

    asyncio.run(main())


def test_a_relay_that_cannot_bind_says_so() -> None:
    async def main() -> None:
        sent: list[p.Message] = []
        role = Role("r", sent.append, sent.append)
        role.handle(p.Relay(KEY.hex(), count=3, index=0), "192.0.2.1")  # not ours
        assert len(sent) == 1 and isinstance(sent[0], p.Relaying) and sent[0].port == 0
        assert role.listening is None

    asyncio.run(main())


def test_in_process_a_member_hands_its_relay_of_the_same_process_its_datagram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hollow mode: no datagram on the network between two simulated agents of one process,
    the same check of its tag and number; a relay gone is reached by the network again."""

    async def main() -> None:
        monkeypatch.setattr(relay_module, "_LOCAL", None)
        relay_module.deliver_in_process()
        posted: list[p.Message] = []
        relay = Role("r", posted.append, posted.append)
        member = Role("m", posted.append, posted.append)
        relay.handle(p.Relay(KEY.hex(), count=2, index=0), "127.0.0.1")
        listening = relay.listening
        assert listening is not None
        member.handle(p.RelayTo("127.0.0.1", listening.port, KEY.hex(), 1), "127.0.0.1")
        member.beat(0.5)
        assert listening.missing(time.monotonic(), 1.0) == []  # heard, with no read
        assert not listening.take(datagram(KEY, 1, 1), time.monotonic())  # older: dropped
        waiting = socket.socket(fileno=os.dup(listening._sock.fileno()))
        try:
            waiting.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing went through the socket
                waiting.recv(64)
        finally:
            waiting.close()
        relay.reset()
        assert relay_module._LOCAL == {}
        member.beat(0.5)  # its relay gone: sent on the network, to nobody (no error)

    asyncio.run(main())
