"""`roster.Answers`: requests that wait for an agent's answer, their deadlines on one timer."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from srtr.backends.agent import protocol as p
from srtr.backends.agent.channel import Connection
from srtr.backends.agent.roster import Answers
from srtr.backends.base import LaunchError


class Conn:
    def __init__(self, node: str) -> None:
        self.node = node
        self.sent: list[p.Message] = []

    def send(self, message: p.Message) -> None:
        self.sent.append(message)


def conn(node: str = "n1") -> Any:
    return cast(Connection, Conn(node))


def test_an_answer_ends_the_wait_and_an_unanswered_request_times_out() -> None:
    async def body() -> None:
        answers = Answers()
        c = conn()
        slow = asyncio.ensure_future(answers.ask(c, lambda seq: p.Signal("a", 0, seq), 0.05))
        quick = asyncio.ensure_future(answers.ask(c, lambda seq: p.Signal("b", 0, seq), 10.0))
        await asyncio.sleep(0)
        seqs = [m.attempt for m in c.sent]  # Signal's third field carries the seq here
        answers.answer(seqs[1], p.Bye())
        assert isinstance(await quick, p.Bye)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow, 5.0)
        assert not answers  # nothing waits any more

    asyncio.run(body())


def test_a_shorter_deadline_asked_later_still_expires_first() -> None:
    async def body() -> None:
        answers = Answers()
        c = conn()
        long = asyncio.ensure_future(answers.ask(c, lambda seq: p.Signal("a", 0, seq), 30.0))
        short = asyncio.ensure_future(answers.ask(c, lambda seq: p.Signal("b", 0, seq), 0.05))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(short, 5.0)
        assert not long.done()  # its own deadline is far away
        answers.fail("n1", "the agent died")
        with pytest.raises(LaunchError):
            await long

    asyncio.run(body())


def test_answered_requests_leave_no_deadline_behind() -> None:
    async def body() -> None:
        answers = Answers()
        c = conn()
        for k in range(100):
            task = asyncio.ensure_future(answers.ask(c, lambda seq: p.Signal("a", 0, seq), 30.0))
            await asyncio.sleep(0)
            answers.answer(c.sent[k].attempt, p.Bye())
            await task
        assert not answers._deadlines and answers._timer is None

    asyncio.run(body())
