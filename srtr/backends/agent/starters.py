"""How the node agents are started and stopped: one process per simulated node (local), or
one srun step for the whole allocation (SLURM).

A starter hands each agent the controller's address on its command line and the job's token
in its environment (never in argv), tells the backend when an agent (or the whole agent
step) ended on its own (`Events.agent_failed`) and, on SLURM, when SLURM says a node is down
(`Events.node_down`, from one `scontrol show node` per period for all nodes).

Both run their processes through `procgroup.ProcessGroups`, like every other launch: on
SLURM that process is the one srun client of the agents' step, whatever the node count.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from srtr.backends import slurm_cmd
from srtr.backends.agent.protocol import TOKEN_ENV
from srtr.backends.base import LaunchError, LaunchSpec, NodeInfo
from srtr.backends.node_tmp import NodeTmp
from srtr.backends.procgroup import (
    Attempt,
    ExitStatus,
    ProcessGroups,
    inherited_environment,
    kill_group,
)
from srtr.backends.slurm import POLL_PERIOD, SlurmCommands, SlurmError
from srtr.tls import FINGERPRINT_ENV

log = logging.getLogger("srtr")

MODULE = "srtr.backends.agent.node"
HOLLOW_MODULE = "srtr.backends.agent.hollow"
# In the run dir: the control FIFO of a hollow process (`hollow.py`).
HOLLOW_CONTROL = "hollow.ctl"
# In the run dir: where a controller writes the HOST:PORT its agents dial (a new controller
# too, when it adopts the job), and the job's agent token (mode 0600, in the 0700 run dir).
RENDEZVOUS = "agents.addr"
TOKEN_FILE = "agents.token"
# How long agents get to exit by themselves after a Shutdown before they are killed.
EXIT_WAIT = 10.0
# Every live agent said goodbye: what the srun client still waits for is a lost node's task,
# which may never report (a dead host). A moment for the exits in flight, then it is killed.
EXIT_WAIT_AFTER_GOODBYES = 1.0
# How long a line for the hollow process may wait for it to read its control FIFO, and how
# often the FIFO is looked at meanwhile.
CONTROL_WAIT = 10.0
CONTROL_RETRY = 0.05


class Events(Protocol):
    """What a starter tells the backend."""

    def agent_failed(self, node: str | None, why: str) -> None:
        """The agent of `node` (None: every agent) ended without being asked to."""
        ...

    def node_down(self, node: str, why: str) -> None:
        """The cluster says `node` is down: its instances are lost."""
        ...


class Starter(Protocol):
    simulated: bool  # nodes are simulated: `kill` fails one on request
    # The job certificate's fingerprint the agents pin (`srtr.tls`); set by the backend
    # before `start`; "" for a channel in the clear (tests of the protocol alone).
    fingerprint: str
    # A node whose agent died can get a new one (`respawn`). Not a simulated node: its agent
    # is the node, and its death is the node's loss.
    respawns: bool

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        """Start one agent per node, dialling `address`; with `spawn` False (adoption: the
        agents of a crashed controller rejoin), only watch the nodes."""
        ...

    async def add(self, nodes: list[NodeInfo]) -> None:
        """Nodes a grow request brought, after `start`: start their agents (local), or know
        them (SLURM: the grow job's step started their agents)."""
        ...

    async def remove(self, names: list[str]) -> None:
        """Nodes that go back to their provider: their agents (told to end) are old news."""
        ...

    def respawn(self, node: str) -> None:
        """Start a new agent on `node` alone (its agent died, or never came), after `start`.
        From now on, the end of an older agent of `node` is old news; a failure to start
        this one is `Events.agent_failed(node, ...)`."""
        ...

    def kill(self, node: str, pid: int | None) -> None:
        """SIGKILL the agent of simulated `node` (a node failure, on request); `pid` is the
        agent's own, for one this starter did not start (adopted)."""
        ...

    async def close(self, within: float = EXIT_WAIT) -> None:
        """Wait up to `within` seconds for the agents to exit (after Shutdown), then kill what
        is left."""
        ...


def _secrets(token: str, fingerprint: str) -> dict[str, str]:
    """The agent's credentials, for its environment (never its argv): the token, and the
    certificate fingerprint it pins."""
    return {TOKEN_ENV: token, **({FINGERPRINT_ENV: fingerprint} if fingerprint else {})}


def _verbatim(spec: LaunchSpec) -> list[str]:
    return list(spec.argv)


def _local_environment(spec: LaunchSpec) -> dict[str, str]:
    """A local agent process's environment: the inherited few, then the spec's (the token)."""
    return {**inherited_environment(), **spec.env}


def _agent_command(
    address: tuple[str, int], run_dir: Path, window: float, *where: str
) -> tuple[str, ...]:
    host, port = address
    rendezvous = run_dir / RENDEZVOUS
    adopt = ("--adopt-window", f"{window:g}", "--rendezvous", str(rendezvous.resolve()))
    return (sys.executable, "-m", MODULE, "--controller", f"{host}:{port}", *adopt, *where)


class LocalAgents:
    """One agent process per simulated node, each a process group of this controller."""

    simulated = True
    fingerprint = ""

    def __init__(
        self,
        nodes: list[NodeInfo],
        run_dir: Path,
        *,
        adopt_window: float = 0.0,
        respawn: bool = False,
        node_tmp: NodeTmp | None = None,
        under: Sequence[str] = (),
    ) -> None:
        """`respawn`: a node whose agent died gets a new one, as on SLURM. Off by default,
        where a simulated node's agent is the node (its death is the node's loss); on in
        tests of the backend's side of respawning. `node_tmp`: each agent, and so every
        instance it starts, runs in its node's view of the machine (`node_tmp`). `under`: a
        command the agents run under (tests: `ip netns exec NAME`, a network of their own
        whose link can go down)."""
        self._node_tmp = node_tmp
        self._under = tuple(under)
        self._nodes = nodes
        self._run_dir = run_dir
        self._window = adopt_window
        self.respawns = respawn
        self._events: Events | None = None
        self._dial: tuple[tuple[str, int], str] | None = None
        self._current: dict[str, str] = {}  # node → process group of its latest agent
        self._added: set[str] = set()  # nodes a grow request brought (`add`): no view
        self._respawned = 0
        self._closing = False
        self._groups = ProcessGroups(
            self._exited, command=_verbatim, environment=_local_environment, owner="agents"
        )

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        self._events = events
        self._dial = (address, token)
        for node in self._nodes if spawn else []:
            if self._node_tmp is not None:  # its view is made off the event loop
                await self._node_tmp.prepare(node.name)
            self._start_one(node)

    async def add(self, nodes: list[NodeInfo]) -> None:
        self._nodes = [*self._nodes, *nodes]
        self._added |= {n.name for n in nodes}
        for node in nodes:
            self._start_one(node)

    async def remove(self, names: list[str]) -> None:
        gone = set(names)
        self._nodes = [n for n in self._nodes if n.name not in gone]
        for name in gone:
            self._current.pop(name, None)

    def _start_one(self, node: NodeInfo, group: str | None = None) -> None:
        assert self._dial is not None
        address, token = self._dial
        env = {**_secrets(token, self.fingerprint), "SRTR_RUN_DIR": str(self._run_dir.resolve())}
        where = ("--node", node.name, "--inherit", "minimal")
        argv = (*self._under, *_agent_command(address, self._run_dir, self._window, *where))
        if self._node_tmp is not None and node.name in self._added:
            # The node helper made its views at the start: a node that joined later gets a
            # TMPDIR of its own, as where the kernel allows no views.
            env["TMPDIR"] = str(self._node_tmp.node_dir(node.name))
        elif self._node_tmp is not None:  # the agent's children inherit its view and TMPDIR
            argv = tuple(self._node_tmp.enter(node.name, list(argv)))
            env["TMPDIR"] = self._node_tmp.tmpdir(node.name)
        self._current[node.name] = group = group or f"agent-{node.name}"
        self._groups.start(
            LaunchSpec(
                name=group,
                node=node.name,
                node_ip=node.ip,
                argv=argv,
                env=env,
                log_path=self._run_dir / "logs" / f"agent-{node.name}.log",
            )
        )

    def respawn(self, node: str) -> None:
        if not self.respawns:
            raise ValueError("a simulated node's agent is the node: it is lost, not respawned")
        if self._closing or self._events is None:
            return
        self._respawned += 1  # a name of its own: the dead one may not be reaped yet
        try:
            info = next(n for n in self._nodes if n.name == node)
            self._start_one(info, f"agent-{node}.{self._respawned}")
        except LaunchError as exc:
            self._events.agent_failed(node, f"its new agent could not be started: {exc}")

    def kill(self, node: str, pid: int | None) -> None:
        attempt = self._groups.get(self._current.get(node, f"agent-{node}"))
        if attempt is not None:
            kill_group(attempt.pgid)
        elif pid is not None:  # an agent a crashed controller started: it is on this machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def close(self, within: float = EXIT_WAIT) -> None:
        self._closing = True
        await self._groups.wait_idle(within)
        await self._groups.close()

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        if self._current.get(attempt.node) != attempt.name:  # an older agent: old news
            return
        what = status.message if status is not None else "exited"
        self._events.agent_failed(
            attempt.node, f"its agent (pid {attempt.pid}) {what}; see logs/agent-{attempt.node}.log"
        )


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
            self._exited, command=_verbatim, environment=_local_environment, owner="agents"
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
        env = {**_secrets(token, self.fingerprint), "SRTR_RUN_DIR": str(self._run_dir.resolve())}
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


class SlurmAgents:
    """One srun step runs an agent on every node of the allocation; one srun client here.

    A node whose agent died (or never came) gets a new one through a one-node step of its
    own (`respawn`): `srun --overlap -N1 -w NODE`, named `srtr-agent-NODE`.
    """

    simulated = False
    respawns = True
    STEP_NAME = "srtr-agents"
    fingerprint = ""

    def __init__(
        self,
        job_id: str,
        nodes: list[NodeInfo],
        run_dir: Path,
        commands: SlurmCommands,
        *,
        poll_period: float = POLL_PERIOD,
        adopt_window: float = 0.0,
    ) -> None:
        self._window = adopt_window
        self._job_id = job_id
        self._nodes = nodes
        self._run_dir = run_dir
        self._commands = commands
        self._poll_period = poll_period
        self._events: Events | None = None
        self._dial: tuple[tuple[str, int], str] | None = None  # (address, token) once started
        self._spawned: dict[str, str] = {}  # node → process group of its latest one-node step
        self._respawned = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._poller: asyncio.Task[None] | None = None
        self._groups = ProcessGroups(
            self._exited, command=_verbatim, environment=self._environment, owner="agents"
        )

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        self._events = events
        self._dial = (address, token)
        self._poller = asyncio.create_task(self._poll_forever())
        if spawn:
            await self._spawn(self._nodes, self.STEP_NAME, self.STEP_NAME)

    async def add(self, nodes: list[NodeInfo]) -> None:
        self._nodes = [*self._nodes, *nodes]  # their agents are the grow job's step

    async def remove(self, names: list[str]) -> None:
        gone = set(names)
        self._nodes = [n for n in self._nodes if n.name not in gone]
        for name in gone:
            self._spawned.pop(name, None)

    def respawn(self, node: str) -> None:
        if self._dial is None or self._closing:
            return
        info = next(n for n in self._nodes if n.name == node)
        self._respawned += 1  # names stay unique while an older step lingers
        group = f"srtr-agent-{node}.{self._respawned}"
        self._spawned[node] = group
        task = asyncio.get_running_loop().create_task(self._respawn(info, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respawn(self, node: NodeInfo, group: str) -> None:
        try:
            await self._spawn([node], f"srtr-agent-{node.name}", group)
        except Exception as exc:  # a node's new agent failing must not take the job down
            log.exception("agents: cannot start a new agent on %s", node.name)
            if self._events is not None:
                self._events.agent_failed(node.name, f"its new agent could not start: {exc}")

    async def _spawn(self, nodes: list[NodeInfo], step_name: str, group: str) -> None:
        assert self._dial is not None
        address, token = self._dial
        names = [n.name for n in nodes]
        rows = await self._node_rows(names)
        cpus = [rows[n].cpus for n in names if n in rows]
        logs = self._run_dir / "logs"
        where = ("--node-env", "SLURMD_NODENAME", "--inherit", "all", "--log-dir", str(logs))
        command = _agent_command(address, self._run_dir, self._window, *where)
        argv = slurm_cmd.agents_srun_argv(
            job_id=self._job_id,
            nodes=names,
            step_name=step_name,
            log_path=logs / "agents.out",
            command=command,
            cpus_per_task=min(c for c in cpus if c) if all(cpus) and cpus else None,
        )
        env = {**_secrets(token, self.fingerprint), "SRTR_RUN_DIR": str(self._run_dir.resolve())}
        self._groups.start(
            LaunchSpec(
                name=group,
                node=names[0],
                node_ip=nodes[0].ip,
                argv=tuple(argv),
                env=env,
                log_path=logs / "agents.out",
            )
        )

    def kill(self, node: str, pid: int | None) -> None:
        raise ValueError("SLURM nodes are real: they fail by themselves, never on request")

    async def close(self, within: float = EXIT_WAIT) -> None:
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self._groups.wait_idle(within)
        await self._groups.close()

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        # The token rides in the srun client's environment; --export=ALL hands it over.
        return slurm_cmd.srun_client_env(os.environ, spec.env)

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        what = status.message if status is not None else "exited"
        if attempt.name == self.STEP_NAME:
            self._events.agent_failed(
                None, f"the agents' step (srun pid {attempt.pid}) {what}; see logs/agents.out"
            )
        elif self._spawned.get(attempt.node) == attempt.name:  # an older one's end is old news
            self._events.agent_failed(
                attempt.node,
                f"its agent's step (srun pid {attempt.pid}) {what}; see logs/agents.out",
            )

    async def _node_rows(self, nodes: list[str] | None = None) -> dict[str, slurm_cmd.NodeRow]:
        names = nodes if nodes is not None else [n.name for n in self._nodes]
        argv = slurm_cmd.scontrol_show_node_argv(names)
        try:
            done = await self._commands.arun(argv, check=False)
        except SlurmError as exc:
            log.warning("agents: %s", exc)
            return {}
        return slurm_cmd.parse_scontrol_nodes(done.stdout) if done.returncode == 0 else {}

    async def _poll_forever(self) -> None:
        while not self._closing:
            try:
                rows = await self._node_rows()
            except Exception:  # the poller must outlive any one bad answer
                log.exception("agents: node poll failed")
                rows = {}
            for name, row in rows.items():
                if row.down and self._events is not None:
                    self._events.node_down(name, f"node {name} is {row.state}")
            await asyncio.sleep(self._poll_period)
