"""Hollow mode's starter (`hollow.py`): ONE process runs every simulated node's agent, told
about nodes that join, leave or fail through a control FIFO in the run dir (`ControlFifo`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import sys
from collections.abc import Sequence
from pathlib import Path

from srtr.backends.agent.starter_base import (
    EXIT_WAIT,
    HOLLOW_CONTROL,
    HOLLOW_MODULE,
    RENDEZVOUS,
    Events,
    agent_env,
    local_environment,
    verbatim,
)
from srtr.backends.base import Descriptors, LaunchSpec, NodeInfo
from srtr.backends.procgroup import Attempt, ExitStatus, ProcessGroups

log = logging.getLogger("srtr")

# How long a line for the hollow process may wait for it to read its control FIFO, and how
# often the FIFO is looked at meanwhile.
CONTROL_WAIT = 10.0
CONTROL_RETRY = 0.05


class ControlFifo:
    """Lines for the hollow process's control FIFO, written without blocking the event loop.

    Each write is whole lines and at most PIPE_BUF bytes, which the kernel writes at once or
    not at all: never cut, never interleaved with another writer's (a test's, a benchmark's).
    A full FIFO (the hollow process busy) is waited out with `add_writer`; sends keep their
    order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    async def send(self, lines: Sequence[str], within: float = CONTROL_WAIT) -> None:
        """Write `lines`; waits up to `within` seconds for a reader (a hollow process just
        started makes its FIFO first) and for room in the FIFO.

        Raises:
            OSError: nobody reads the FIFO, or not in time (TimeoutError).
        """
        chunks = _chunks(lines)
        async with self._lock:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            fd = await self._open(deadline)
            try:
                for chunk in chunks:
                    await self._write(fd, chunk, deadline)
            finally:
                os.close(fd)

    async def _open(self, deadline: float) -> int:
        loop = asyncio.get_running_loop()
        while True:
            try:
                return os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:  # ENOENT: not made yet; ENXIO: nobody reads it
                if exc.errno not in (errno.ENOENT, errno.ENXIO) or loop.time() >= deadline:
                    raise
            await asyncio.sleep(CONTROL_RETRY)

    async def _write(self, fd: int, chunk: bytes, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                os.write(fd, chunk)  # ≤ PIPE_BUF on a pipe: all of it, or EAGAIN
                return
            except BlockingIOError:  # full: wait for the reader to make room
                async with asyncio.timeout_at(max(deadline, loop.time() + CONTROL_RETRY)):
                    await _writable(fd)


async def _writable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    room: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not room.done():
            room.set_result(None)

    loop.add_writer(fd, ready)
    try:
        await room
    finally:
        loop.remove_writer(fd)


def _chunks(lines: Sequence[str]) -> list[bytes]:
    """`lines` packed into writes of whole lines, each at most PIPE_BUF bytes."""
    chunks: list[bytes] = []
    current = b""
    for line in lines:
        data = f"{line}\n".encode()
        if len(data) > select.PIPE_BUF:
            raise ValueError(f"a control line over {select.PIPE_BUF} bytes: {line[:40]!r}...")
        if len(current) + len(data) > select.PIPE_BUF:
            chunks.append(current)
            current = b""
        current += data
    return [*chunks, current] if current else chunks


class HollowAgents:
    """Hollow mode (`hollow.py`): ONE process here runs every node's agent, each with its own
    connection, on simulated processes. For scale tests and benchmarks, not for jobs."""

    simulated = True
    respawns = False  # a hollow node's agent is the node, as a local one's is
    # One process for every node.
    descriptors = Descriptors(
        per_node=0, per_instance=0, watched_per_node=0, watched_per_instance=0
    )
    NAME = "hollow-agents"
    fingerprint = ""

    def __init__(self, nodes: list[NodeInfo], run_dir: Path, *, adopt_window: float = 0.0) -> None:
        self._nodes = nodes
        self._run_dir = run_dir
        self._window = adopt_window
        self._events: Events | None = None
        self._closing = False
        self._control = ControlFifo(run_dir / HOLLOW_CONTROL)
        self._tasks: set[asyncio.Task[None]] = set()
        self._groups = ProcessGroups(
            self._exited, command=verbatim, environment=local_environment, owner="agents"
        )

    @property
    def control(self) -> Path:
        return self._control.path

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        self._events = events
        if not spawn:
            return
        host, port = address
        logs = self._run_dir / "logs"
        argv = (
            sys.executable,
            "-m",
            HOLLOW_MODULE,
            "--controller",
            f"{host}:{port}",
            "--nodes",
            ",".join(n.name for n in self._nodes),
            "--control",
            str(self.control.resolve()),
            "--log-dir",
            str(logs.resolve()),
            "--adopt-window",
            f"{self._window:g}",
            "--rendezvous",
            str((self._run_dir / RENDEZVOUS).resolve()),
        )
        env = agent_env(token, self.fingerprint, self._run_dir)
        self._groups.start(
            LaunchSpec(
                name=self.NAME,
                node=self._nodes[0].name,
                node_ip=self._nodes[0].ip,
                argv=argv,
                env=env,
                log_path=logs / "hollow.out",
            )
        )

    async def add(self, nodes: list[NodeInfo]) -> None:
        """The hollow process starts an agent for each (`add NODE`); one it cannot be told
        about has no agent (`Events.agent_failed`), as a local node whose agent failed."""
        self._nodes = [*self._nodes, *nodes]
        try:
            await self._control.send([f"add {n.name}" for n in nodes])
        except OSError as exc:
            log.warning("agents: cannot add hollow nodes: %s", exc)
            for node in nodes:
                if self._events is not None:
                    self._events.agent_failed(node.name, f"the hollow process is not there: {exc}")

    async def remove(self, names: list[str]) -> None:
        gone = set(names)
        self._nodes = [n for n in self._nodes if n.name not in gone]
        try:
            await self._control.send([f"remove {name}" for name in names])
        except OSError as exc:  # gone with the hollow process: nothing to end
            log.warning("agents: cannot remove hollow nodes: %s", exc)

    def respawn(self, node: str) -> None:
        raise ValueError("a hollow node's agent is the node: it is lost, not respawned")

    def kill(self, node: str, pid: int | None) -> None:
        """The hollow process drops `node`'s connection and forgets its instances."""
        task = asyncio.get_running_loop().create_task(self._kill(node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kill(self, node: str) -> None:
        try:
            await self._control.send([f"kill {node}"], within=0.0)
        except OSError as exc:  # ENXIO: nobody reads it (the hollow process is gone)
            log.warning("agents: cannot kill hollow node %s: %s", node, exc)

    async def close(self, within: float = EXIT_WAIT) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await self._groups.wait_idle(within)
        await self._groups.close()

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        what = status.message if status is not None else "exited"
        self._events.agent_failed(
            None, f"the hollow agents' process (pid {attempt.pid}) {what}; see logs/hollow.log"
        )
