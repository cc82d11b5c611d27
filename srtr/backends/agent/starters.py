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
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Protocol

from srtr.backends import slurm_cmd
from srtr.backends.agent.protocol import TOKEN_ENV
from srtr.backends.base import LaunchSpec, NodeInfo
from srtr.backends.procgroup import INHERITED_ENV, Attempt, ExitStatus, ProcessGroups, kill_group
from srtr.backends.slurm import POLL_PERIOD, SlurmCommands, SlurmError

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

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        """Start one agent per node, dialling `address`; with `spawn` False (adoption: the
        agents of a crashed controller rejoin), only watch the nodes."""
        ...

    def kill(self, node: str, pid: int | None) -> None:
        """SIGKILL the agent of simulated `node` (a node failure, on request); `pid` is the
        agent's own, for one this starter did not start (adopted)."""
        ...

    async def close(self) -> None:
        """Wait a little for the agents to exit (after Shutdown), then kill what is left."""
        ...


def _verbatim(spec: LaunchSpec) -> list[str]:
    return list(spec.argv)


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

    def __init__(self, nodes: list[NodeInfo], run_dir: Path, *, adopt_window: float = 0.0) -> None:
        self._nodes = nodes
        self._run_dir = run_dir
        self._window = adopt_window
        self._events: Events | None = None
        self._closing = False
        self._groups = ProcessGroups(
            self._exited, command=_verbatim, environment=self._environment, owner="agents"
        )

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        self._events = events
        if not spawn:
            return
        env = {TOKEN_ENV: token, "SRTR_RUN_DIR": str(self._run_dir.resolve())}
        for node in self._nodes:
            where = ("--node", node.name, "--inherit", "minimal")
            argv = _agent_command(address, self._run_dir, self._window, *where)
            self._groups.start(
                LaunchSpec(
                    name=f"agent-{node.name}",
                    node=node.name,
                    node_ip=node.ip,
                    argv=argv,
                    env=env,
                    log_path=self._run_dir / "logs" / f"agent-{node.name}.log",
                )
            )

    def kill(self, node: str, pid: int | None) -> None:
        attempt = self._groups.get(f"agent-{node}")
        if attempt is not None:
            kill_group(attempt.pgid)
        elif pid is not None:  # an agent a crashed controller started: it is on this machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def close(self) -> None:
        self._closing = True
        await self._groups.wait_idle(EXIT_WAIT)
        await self._groups.close()

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
        return {**env, **spec.env}

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        what = status.message if status is not None else "exited"
        self._events.agent_failed(
            attempt.node, f"its agent (pid {attempt.pid}) {what}; see logs/agent-{attempt.node}.log"
        )


class HollowAgents:
    """Hollow mode (`hollow.py`): ONE process here runs every node's agent, each with its own
    connection, on simulated processes. For scale tests and benchmarks, not for jobs."""

    simulated = True
    NAME = "hollow-agents"

    def __init__(self, nodes: list[NodeInfo], run_dir: Path, *, adopt_window: float = 0.0) -> None:
        self._nodes = nodes
        self._run_dir = run_dir
        self._window = adopt_window
        self._events: Events | None = None
        self._closing = False
        self._groups = ProcessGroups(
            self._exited, command=_verbatim, environment=self._environment, owner="agents"
        )

    @property
    def control(self) -> Path:
        return self._run_dir / HOLLOW_CONTROL

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
        env = {TOKEN_ENV: token, "SRTR_RUN_DIR": str(self._run_dir.resolve())}
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

    def kill(self, node: str, pid: int | None) -> None:
        """The hollow process drops `node`'s connection and forgets its instances."""
        try:
            fd = os.open(self.control, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:  # ENXIO: nobody reads it (the hollow process is gone)
            log.warning("agents: cannot kill hollow node %s: %s", node, exc)
            return
        try:
            os.write(fd, f"kill {node}\n".encode())
        finally:
            os.close(fd)

    async def close(self) -> None:
        self._closing = True
        await self._groups.wait_idle(EXIT_WAIT)
        await self._groups.close()

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
        return {**env, **spec.env}

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        what = status.message if status is not None else "exited"
        self._events.agent_failed(
            None, f"the hollow agents' process (pid {attempt.pid}) {what}; see logs/hollow.log"
        )


class SlurmAgents:
    """One srun step runs an agent on every node of the allocation; one srun client here."""

    simulated = False
    STEP_NAME = "srtr-agents"

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
        self._closing = False
        self._poller: asyncio.Task[None] | None = None
        self._groups = ProcessGroups(
            self._exited, command=_verbatim, environment=self._environment, owner="agents"
        )

    async def start(
        self, address: tuple[str, int], token: str, events: Events, *, spawn: bool = True
    ) -> None:
        self._events = events
        self._poller = asyncio.create_task(self._poll_forever())
        if spawn:
            await self._spawn(address, token)

    async def _spawn(self, address: tuple[str, int], token: str) -> None:
        names = [n.name for n in self._nodes]
        rows = await self._node_rows()
        cpus = [rows[n].cpus for n in names if n in rows]
        logs = self._run_dir / "logs"
        where = ("--node-env", "SLURMD_NODENAME", "--inherit", "all", "--log-dir", str(logs))
        command = _agent_command(address, self._run_dir, self._window, *where)
        argv = slurm_cmd.agents_srun_argv(
            job_id=self._job_id,
            nodes=names,
            step_name=self.STEP_NAME,
            log_path=logs / "agents.out",
            command=command,
            cpus_per_task=min(c for c in cpus if c) if all(cpus) and cpus else None,
        )
        env = {TOKEN_ENV: token, "SRTR_RUN_DIR": str(self._run_dir.resolve())}
        self._groups.start(
            LaunchSpec(
                name=self.STEP_NAME,
                node=names[0],
                node_ip=self._nodes[0].ip,
                argv=tuple(argv),
                env=env,
                log_path=logs / "agents.out",
            )
        )

    def kill(self, node: str, pid: int | None) -> None:
        raise ValueError("SLURM nodes are real: they fail by themselves, never on request")

    async def close(self) -> None:
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self._groups.wait_idle(EXIT_WAIT)
        await self._groups.close()

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        # The token rides in the srun client's environment; --export=ALL hands it over.
        return slurm_cmd.srun_client_env(os.environ, spec.env)

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._closing or self._events is None:
            return
        what = status.message if status is not None else "exited"
        self._events.agent_failed(
            None, f"the agents' step (srun pid {attempt.pid}) {what}; see logs/agents.out"
        )

    async def _node_rows(self) -> dict[str, slurm_cmd.NodeRow]:
        argv = slurm_cmd.scontrol_show_node_argv([n.name for n in self._nodes])
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
