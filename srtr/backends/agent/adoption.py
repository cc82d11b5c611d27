"""Adoption (`srtr up --adopt`): a new controller takes over the agents of a crashed one.

The controller's listening address goes into the run dir's rendezvous file (`publish`),
where the agents of a crashed controller look for it; they rejoin with the job's token (the
run dir's token file, `read_token`) and list what they kept, and `Adoption.claim` matches
that against each instance's recorded identity (pid and start time, marked `agent`). What
an agent kept that no record claims (started just before the crash) is killed once the
adoption has claimed its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.agent.roster import Live, NodeState
from srtr.backends.agent.starter_base import RENDEZVOUS, TOKEN_FILE
from srtr.backends.base import Identity

log = logging.getLogger("srtr")

REJOIN_WAIT = 15.0  # for a crashed controller's agents to rejoin
UNCLAIMED_AFTER = 5.0  # then what no record claimed is killed


class Adoption:
    """The rejoining of a crashed controller's agents, and the claims on what they kept."""

    def __init__(
        self,
        nodes: dict[str, NodeState],
        start_agents: Callable[[], Awaitable[None]],
        lose: Callable[[str, str], None],
    ) -> None:
        """`nodes` is the backend's own; `start_agents` opens the listener, `lose` loses a
        node whose agent did not rejoin."""
        self._nodes = nodes
        self._start_agents = start_agents
        self._lose = lose
        self._rejoined: asyncio.Future[None] | None = None
        self._claimed: set[tuple[str, str, int]] = set()  # (node, name, attempt) adopted

    def begin(self) -> None:
        """Call the crashed controller's agents back, once: at once on adoption, whatever is
        adopted, so that none of them gives up waiting."""
        if self._rejoined is None:
            self._rejoined = asyncio.ensure_future(self._rejoin())

    async def rejoined(self) -> None:
        """Wait until every node's agent is back (or `REJOIN_WAIT` passed); a node whose
        agent does not come back is lost. Once, whoever asks first."""
        self.begin()
        assert self._rejoined is not None
        await asyncio.shield(self._rejoined)

    async def claim(self, name: str, attempt: int, identity: Identity) -> Live | None:
        """Once the agents have rejoined, the instance of one of them that runs exactly that
        attempt (None: none does); it is then adopted, and no longer killed as unclaimed."""
        await self.rejoined()
        for state in self._nodes.values():
            for kept in state.conn.live if state.conn is not None else []:
                if kept[:4] == [name, attempt, identity.get("pid"), identity.get("start")]:
                    self._claimed.add((state.info.name, name, attempt))
                    return Live(state.info.name, attempt, kept[2], kept[3])
        return None

    async def _rejoin(self) -> None:
        await self._start_agents()
        waits = [s.ready.wait() for s in self._nodes.values()]
        try:
            async with asyncio.timeout(REJOIN_WAIT):
                await asyncio.gather(*waits)
        except TimeoutError:
            pass
        for state in self._nodes.values():
            if state.conn is None:
                self._lose(state.info.name, f"its agent did not rejoin within {REJOIN_WAIT:g}s")
        # What an agent kept that state.json did not know (started just before the crash)
        # belongs to nobody: once the adoption has claimed its own, those are killed.
        asyncio.get_running_loop().call_later(UNCLAIMED_AFTER, self._kill_unclaimed)

    def _kill_unclaimed(self) -> None:
        for state in self._nodes.values():
            conn = state.conn
            for name, attempt, *_ in conn.live if conn is not None else []:
                if conn is not None and (conn.node, name, attempt) not in self._claimed:
                    log.warning("agents: killing %s on %s: nothing adopted it", name, conn.node)
                    conn.send(p.Signal(name, 9, attempt))


def publish(run_dir: Path, token: str, address: tuple[str, int], *, adopting: bool) -> None:
    """Write where the agents dial (the rendezvous file) and, unless adopting (the token is
    the crashed controller's, there already), the job's token, for a later adoption."""
    if not adopting:
        _write_private(run_dir / TOKEN_FILE, token + "\n")
    _write_private(run_dir / RENDEZVOUS, f"{address[0]}:{address[1]}\n")


def read_token(run_dir: Path) -> str:
    """The agent token a controller of this run dir wrote (for `srtr up --adopt`)."""
    return (run_dir / TOKEN_FILE).read_text().strip()


def _write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by its owner only, never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
