"""How the node agents are started and stopped: one process per simulated node (local), or
one srun step for the whole allocation (SLURM); hollow mode's one process for every node is
`hollow_starter.HollowAgents`, and what every starter is and hands its agents is
`starter_base`'s (all re-exported here, the starters' one address).

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
from collections.abc import Sequence
from pathlib import Path

from srtr.backends.agent.hollow_starter import HollowAgents as HollowAgents
from srtr.backends.agent.starter_base import EXIT_WAIT as EXIT_WAIT
from srtr.backends.agent.starter_base import HOLLOW_CONTROL as HOLLOW_CONTROL
from srtr.backends.agent.starter_base import RENDEZVOUS as RENDEZVOUS
from srtr.backends.agent.starter_base import TOKEN_FILE as TOKEN_FILE
from srtr.backends.agent.starter_base import Events as Events
from srtr.backends.agent.starter_base import Starter as Starter
from srtr.backends.agent.starter_base import (
    agent_command,
    agent_env,
    local_environment,
    verbatim,
)
from srtr.backends.base import Descriptors, LaunchError, LaunchSpec, NodeInfo
from srtr.backends.local.node_tmp import NodeTmp
from srtr.backends.procgroup import Attempt, ExitStatus, ProcessGroups, kill_group
from srtr.backends.slurm import cmd as slurm_cmd
from srtr.backends.slurm.backend import POLL_PERIOD, SlurmCommands, SlurmError

log = logging.getLogger("srtr")


class LocalAgents:
    """One agent process per simulated node, each a process group of this controller."""

    simulated = True
    fingerprint = ""
    # Each agent in its node's view (a mount namespace's descriptor), and its pidfd.
    descriptors = Descriptors(
        per_node=1, per_instance=0, watched_per_node=1, watched_per_instance=0
    )

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
            self._exited, command=verbatim, environment=local_environment, owner="agents"
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
        env = agent_env(token, self.fingerprint, self._run_dir)
        where = ("--node", node.name, "--inherit", "minimal")
        argv = (*self._under, *agent_command(address, self._run_dir, self._window, *where))
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


class SlurmAgents:
    """One srun step runs an agent on every node of the allocation; one srun client here.

    A node whose agent died (or never came) gets a new one through a one-node step of its
    own (`respawn`): `srun --overlap -N1 -w NODE`, named `srtr-agent-NODE`.
    """

    simulated = False
    respawns = True
    # One srun client for every agent (and one for each respawned agent's step).
    descriptors = Descriptors(
        per_node=0, per_instance=0, watched_per_node=0, watched_per_instance=0
    )
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
            self._exited, command=verbatim, environment=self._environment, owner="agents"
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
        command = agent_command(address, self._run_dir, self._window, *where)
        argv = slurm_cmd.agents_srun_argv(
            job_id=self._job_id,
            nodes=names,
            step_name=step_name,
            log_path=logs / "agents.out",
            command=command,
            cpus_per_task=min(c for c in cpus if c) if all(cpus) and cpus else None,
        )
        env = agent_env(token, self.fingerprint, self._run_dir)
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
