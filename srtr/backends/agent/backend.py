"""The agent backend: instances run under a node agent on each node (`srtr up --launcher agent`).

On the first launch `AgentBackend` opens the agents' channel (`channel.AgentServer`) and
has its `Starter` start one agent per node (local: a process each; SLURM: one srun step for
the allocation). A launch is a `Launch` message to the node's agent and its `Launched`
answer (the pid); a signal is a `Signal` message; exits come back as `Exited`. What SLURM
must set up itself (a container, `srun_options`, `cpus_per_task`, `cpu_bind`:
`resources.launchers`) keeps its own srun step through the SLURM backend inside (`steps`).

Node loss: an agent whose connection ends, or that is silent for `channel.SILENCE` seconds,
or whose node SLURM reports down, takes its node with it: every instance there is reported
LOST, an agent still connected is told to kill them, and nothing launches there again. A
node lost while its agent may live on (silent: a partition; or down in SLURM's eyes) may
still run them until its agent's lease runs out and its grace passes: the LOST
observation says by when (`extra["fenced_in"]`, seconds), and `replace_lost` waits for it.

Adoption (`srtr up --adopt`: a crashed controller's agents rejoin) is `adoption.py`'s;
nodes that join after the start (a grow request) are `growth.py`'s.

`AgentProber` (`probing.py`) runs readiness probes on the instance's node, by its agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.agent.adoption import Adoption, publish
from srtr.backends.agent.adoption import read_token as read_token
from srtr.backends.agent.channel import FDS_PER_AGENT, LEASE, AgentServer, Connection
from srtr.backends.agent.growth import Growth
from srtr.backends.agent.probe_requests import ProbesOnAgents
from srtr.backends.agent.probing import AgentProber as AgentProber
from srtr.backends.agent.roster import (
    Answers,
    Live,
    LiveAttempts,
    NodeState,
    Presence,
    wait_connected,
)
from srtr.backends.agent.starter_base import EXIT_WAIT, EXIT_WAIT_AFTER_GOODBYES, Starter
from srtr.backends.agent.watched import Watched
from srtr.backends.base import (
    Backend,
    Capabilities,
    Identity,
    LaunchError,
    LaunchSpec,
    Listener,
    NodeInfo,
    NodeLostError,
    Observation,
    ObservationKind,
    host_has_program,
)
from srtr.resources.launchers import Launcher, instance_launcher, own_step_reasons

log = logging.getLogger("srtr")

ANSWER_TIMEOUT = 30.0  # for an agent to answer a launch
CLOSE_TIMEOUT = 10.0  # for the agents to report their last exits after a Shutdown
# A lost node's instances count as gone this long after its agent's lease plus their grace:
# the agent's own timer and its SIGKILL's reaping, on a loaded machine.
FENCE_MARGIN = 0.5
# Launches in flight at once (`Capabilities.launches_in_flight`): one after another, 4,096
# launches on 1,024 hollow agents paid a round trip each (~1.5 ms, both ends mostly idle);
# together they share the loops' wake-ups, reads and writes. 64 left both ends of a
# 10,000 x 8 hollow job idle a third of its stages (each waiting for the other's longer turns).
LAUNCHES_IN_FLIGHT = 256
# A node whose agent died this many times (each replaced through a one-node step) is lost:
# something there kills agents, and a fourth one would die too.
MAX_RESPAWNS = 3


class AgentBackend(ProbesOnAgents):
    """Runs instance attempts through one node agent per node.

    Args:
        nodes: the allocation, in order; every node gets an agent.
        starter: starts and stops the agents.
        steps: the SLURM backend, for the instances that need their own step; None
            where there are no steps (local).
        host: the address of this machine the agents dial.
        token: the job's agent token (default: 32 random bytes; tests pass their own).
        run_dir: where the rendezvous and token files go (`starter_base.RENDEZVOUS`,
            `starter_base.TOKEN_FILE`), so a controller can adopt the job; None: nowhere.
        adopt: take over the agents of a crashed controller (`srtr up --adopt`): start
            none, wait for them to rejoin; `token` must be the job's.
        lease: seconds an agent with no heartbeat acknowledged fences itself
            (`channel.LEASE`; 0: never).
        tls, fingerprint: the server context of the job's certificate (`certs`), and
            its fingerprint, which the agents get next to the token and pin; None and
            "": the channel is in the clear (tests of the protocol alone).
        grown: nodes of `nodes` that a grow request brought (adoption: `add_nodes`
            names the others). Their agent is their job's only step: it gets no
            new one, and no instance step of the main job runs there.
    """

    def __init__(
        self,
        nodes: list[NodeInfo],
        starter: Starter,
        *,
        steps: Backend | None = None,
        host: str = "127.0.0.1",
        token: str | None = None,
        run_dir: Path | None = None,
        adopt: bool = False,
        lease: float = LEASE,
        tls: ssl.SSLContext | None = None,
        fingerprint: str = "",
        grown: Sequence[str] = (),
    ) -> None:
        self._nodes = {n.name: NodeState(n) for n in nodes}
        self._starter = starter
        self._steps = steps
        self._host = host
        self._token = token or secrets.token_urlsafe(32)
        self._run_dir = run_dir
        self._adopting = adopt
        self._lease = lease
        self._tls = tls
        starter.fingerprint = fingerprint
        self.name = steps.name if steps is not None else "local"
        self.capabilities = _capabilities(steps, starter)
        # The steps backend's launches stay one at a time, as its own controllers ask them.
        self._step_launches = asyncio.Lock()
        self._listener: Listener | None = None
        self._server: AgentServer | None = None
        self._started = asyncio.Lock()
        self._started_all = False  # the channel is open and the starter started the agents
        self._batch: list[Observation] | None = None  # observations due in one callback
        self._answers = Answers()
        self._live = LiveAttempts()
        self._watched = Watched()  # probes the agents run in a loop (`watch`)
        self._on_step: set[str] = set()  # names whose current attempt is an srun step
        self._graces: dict[str, float] = {}  # the grace each agent was given (its fence)
        self._max_grace = p.DEFAULT_GRACE
        self._closing = False
        self._no_agents = asyncio.Event()  # set while no agent is connected
        self._presence = Presence(self._nodes, self._no_agents)
        self._adoption = Adoption(self._nodes, self._start_agents, self._lose)
        self._growth = Growth(self._nodes, starter, self._start_agents, self._presence.note, grown)
        # Told when a grow job's agent dialled in: its provider looks at its queue sooner.
        self.on_admitted: Callable[[], None] | None = None

    # -- the Backend protocol -------------------------------------------------------------

    @property
    def owns_allocation(self) -> bool:
        return self._steps.owns_allocation if self._steps is not None else False

    def nodes(self) -> list[NodeInfo]:
        return [n.info for n in self._nodes.values()]

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener
        if self._steps is not None:
            self._steps.set_listener(listener)
        if self._adopting:
            self._adoption.begin()

    def launcher_of(self, spec: LaunchSpec) -> Launcher:
        reasons = own_step_reasons(
            container=spec.container,
            cpus_per_task=spec.cpus_per_task,
            cpu_bind=spec.cpu_bind,
            srun_options=spec.srun_options,
            export_env=spec.export_env,
        )
        return instance_launcher(Launcher.AGENT, reasons, steps=self._steps is not None)

    async def launch(self, spec: LaunchSpec) -> int:
        state = self._nodes.get(spec.node)
        if state is not None and state.lost is not None:
            raise NodeLostError(f"cannot start {spec.name!r} on {spec.node}: {state.lost}")
        if self._steps is not None and self.launcher_of(spec) is Launcher.STEP:
            if spec.node in self._growth.grown:
                raise LaunchError(
                    f"cannot start {spec.name!r} on {spec.node}: it runs as a SLURM step of "
                    "the main job, and that node came from a grow job"
                )
            self._on_step.add(spec.name)
            async with self._step_launches:
                return await self._steps.launch(spec)
        self._on_step.discard(spec.name)
        self._graces[spec.name] = spec.stop_grace_seconds
        self._max_grace = max(self._max_grace, spec.stop_grace_seconds)
        conn = await self._agent_of(spec.node, spec.name)
        reply = await self._ask(conn, spec)
        if isinstance(reply, p.LaunchFailed):
            raise LaunchError(reply.message)
        assert isinstance(reply, p.Launched)
        return reply.pid

    async def signal(self, name: str, signum: int) -> None:
        if name in self._on_step and self._steps is not None:
            await self._steps.signal(name, signum)
            return
        live = self._live.get(name)
        conn = self._nodes[live.node].conn if live is not None else None
        if conn is not None:
            conn.send(p.Signal(name, signum))

    def running(self) -> set[str]:
        steps = self._steps.running() if self._steps is not None else set()
        return set(self._live) | steps

    def identity(self, name: str) -> Identity | None:
        """Steps: the srun client's. An agent's instance: its pid and start time on its
        node, marked `agent` (the guard leaves those to their agents)."""
        if name in self._on_step and self._steps is not None:
            return self._steps.identity(name)
        live = self._live.get(name)
        if live is None or live.start is None:
            return None
        return {"pid": live.pid, "start": live.start, "agent": 1}

    async def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """A step: the steps backend's. An agent's instance: once the agents have rejoined
        (`adoption.REJOIN_WAIT` at most), whether one of them still runs exactly that attempt."""
        if not identity.get("agent"):
            adopted = self._steps is not None and await self._steps.adopt(name, attempt, identity)
            if adopted:
                self._on_step.add(name)
            return adopted
        live = await self._adoption.claim(name, attempt, identity)
        if live is not None:
            self._live[name] = live
        return live is not None

    def has_program(self, what: str, name: str) -> bool:
        return host_has_program(what, name)

    async def end_time(self) -> float | None:
        return await self._steps.end_time() if self._steps is not None else None

    def lose_node(self, node: str) -> list[str]:
        """Fail simulated `node`: SIGKILL its agent (its instances' leaders die with it) and
        report its instances LOST at once. Returns their names."""
        if not self._starter.simulated:
            raise ValueError(f"the {self.name} backend has no simulated nodes to lose")
        if node not in self._nodes:
            raise ValueError(f"no node named {node!r}")
        taken = self._live.on(node)
        self._starter.kill(node, self.agent_pid(node))
        self._lose(node, f"node {node} was lost (simulated: its agent was killed)")
        return taken

    async def add_nodes(self, nodes: Sequence[NodeInfo]) -> None:
        """Nodes a grow request brought join the job (`controllers/grow.py`; `growth.Growth.add`):
        the starter gives each an agent (on SLURM the grow job's own step started them:
        `admit`), and they count once their agent connected, or failed to within `CONNECT_TIMEOUT`.

        Raises:
            ValueError: a node of that name is already one of the job's.
        """
        await self._growth.add(nodes)

    def admit(self, count: int) -> None:
        """Let up to `count` agents of nodes the job does not know yet join (`Growth.admit`)."""
        self._growth.admit(count)

    async def remove_nodes(self, names: Sequence[str]) -> None:
        """Nodes that go back to their provider leave the job (`Growth.remove`)."""
        await self._growth.remove(names)

    async def close(self) -> None:
        """Tell every agent to kill its instances and report them, wait for that, stop the
        agents and the channel, then close the steps backend."""
        self._closing = True
        if self._server is not None:
            self._server.relays.end()
        for state in self._nodes.values():
            state.ready.set()
            if state.conn is not None:
                state.conn.send(p.Shutdown("the job ended"))
        self._presence.note()
        within = EXIT_WAIT
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._no_agents.wait()
            within = EXIT_WAIT_AFTER_GOODBYES
            if any(state.cut_off for state in self._nodes.values()):
                # An agent cut off from us never ends its task: the agents' srun client
                # would wait for it until SLURM reaches the node. Every other agent said
                # goodbye; end the client now, or a teardown during a partition waits for it.
                within = 0.0
        except TimeoutError:
            log.warning("agents: not every agent said goodbye within %gs", CLOSE_TIMEOUT)
        await self._starter.close(within)
        if self._server is not None:
            await self._server.close()
        if self._steps is not None:
            await self._steps.close()

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the agents dial, once they were started."""
        return self._server.address if self._server is not None else None

    def agent_pid(self, node: str) -> int | None:
        """The pid of `node`'s connected agent (on its node), or None."""
        conn = self._nodes[node].conn
        return conn.pid if conn is not None else None

    # -- the channel's handler ------------------------------------------------------------

    def refuse(self, node: str) -> str | None:
        state = self._nodes.get(node)
        if state is None and not self._closing and self._growth.let_in(node):
            state = self._nodes[node]  # a grow job's agent, ahead of its grant (`admit`)
            if self.on_admitted is not None:
                self.on_admitted()
        if state is None:
            return f"{node} is not a node of this job"
        if self._closing:
            return "the job is ending"
        if state.lost is not None:
            return f"the node is lost: {state.lost}"
        if state.conn is not None:
            return f"{node} has an agent already (pid {state.conn.pid})"
        return None

    def awaiting(self) -> bool:
        return bool(self._answers)

    def connected(self, conn: Connection) -> None:
        state = self._nodes[conn.node]
        state.conn, state.failed = conn, None
        state.ready.set()
        self._no_agents.clear()
        log.info("agents: the agent of %s (pid %d) is connected", conn.node, conn.pid)

    def received(self, conn: Connection, message: p.Message) -> None:
        if isinstance(message, p.Launched):
            live = Live(conn.node, message.attempt, message.pid, message.start)
            self._live[message.name] = live
            self._seal()
            self._answers.answer(message.seq, message)
        elif isinstance(message, p.LaunchFailed | p.ProbeResult):
            self._seal()
            self._answers.answer(message.seq, message)
        elif isinstance(message, p.Exited):
            self._watched.exited(message.name)
            self._exited(conn, message)
        elif isinstance(message, p.Health):
            self._watched.health(message)
        elif not isinstance(message, p.Bye):
            log.warning("agents: %s sent an unexpected %s", conn.node, type(message).__name__)

    def gone(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        """A closed connection is a dead agent on a live node (the node's kernel closed it):
        where the starter can, a new agent takes its place. A silent one is a lost node."""
        state = self._nodes.get(conn.node)
        if state is None:  # its node went back to its provider (`remove_nodes`)
            self._presence.note()
            return
        if state.conn is conn:
            state.conn = None
        if not self._closing:
            died = f"its agent (pid {conn.pid}) died: {why}"
            if silent or not self._respawn(conn.node, died):
                # Silent: the agent may live on, cut off, until its lease runs out. Closed:
                # its instances' leaders died with it.
                heard = conn.last_seen if silent else None
                self._lose(conn.node, f"node {conn.node} was lost: {why}", heard=heard)
        self._presence.note()

    # -- the starter's events -------------------------------------------------------------

    def agent_failed(self, node: str | None, why: str) -> None:
        for state in self._nodes.values():
            if node not in (None, state.info.name) or state.conn is not None:
                continue  # a connected agent's end is seen on its connection
            if state.lost is None and state.failed is None:
                if not self._closing:  # at the job's end, an exit is no news
                    log.warning("agents: no agent on %s: %s", state.info.name, why)
                state.failed = why
                state.ready.set()

    def node_down(self, node: str, why: str) -> None:
        if node in self._nodes and self._nodes[node].lost is None:
            conn = self._nodes[node].conn  # SLURM cannot reach it; its agent may live on
            self._lose(node, why, heard=conn.last_seen if conn is not None else None)

    # -- inside ---------------------------------------------------------------------------

    async def _agent_of(self, node: str, name: str) -> Connection:
        """The connection of `node`'s agent, starting the agents first if need be."""
        state = self._nodes.get(node)
        if state is None:
            raise LaunchError(f"cannot start {name!r}: {node} is not a node of this job")
        if self._adopting:
            await self._adoption.rejoined()
        await self._start_agents()
        if state.conn is None and state.lost is None and state.failed is not None:
            self._respawn(node, f"it has no agent: {state.failed}")  # a node that joins late
        if state.conn is None and state.lost is None and state.failed is None:
            await wait_connected([state])
        if state.lost is not None:
            raise NodeLostError(f"cannot start {name!r} on {node}: {state.lost}")
        if state.conn is None:
            why = state.failed or "the job is ending"
            raise LaunchError(f"cannot start {name!r} on {node}: {why}")
        return state.conn

    async def _start_agents(self) -> None:
        if self._started_all:
            return  # every launch asks: no lock taken and released for each of 80,000
        async with self._started:
            if self._server is not None:
                return
            self._server = AgentServer(
                self._token, self, lease=self._lease, tls=self._tls, relayed=list(self._nodes)
            )
            address = await self._server.start(self._host)
            log.info("agents: listening on %s:%d", *address)
            if self._run_dir is not None:
                publish(self._run_dir, self._token, address, adopting=self._adopting)
            await self._starter.start(address, self._token, self, spawn=not self._adopting)
            self._started_all = True

    async def _ask(self, conn: Connection, spec: LaunchSpec) -> p.Message:
        try:
            return await self._answers.ask(conn, lambda seq: p.Launch(seq, spec), ANSWER_TIMEOUT)
        except TimeoutError:
            conn.send(p.Signal(spec.name, 9, spec.attempt))  # in case it starts after all
            raise LaunchError(
                f"cannot start {spec.name!r}: the agent of {conn.node} did not answer within "
                f"{ANSWER_TIMEOUT:g}s"
            ) from None

    def _exited(self, conn: Connection, message: p.Exited) -> None:
        live = self._live.get(message.name)
        if live is None or live.attempt != message.attempt or live.node != conn.node:
            return
        del self._live[message.name]
        observation = Observation(
            kind=ObservationKind.EXITED,
            name=message.name,
            attempt=message.attempt,
            pid=message.pid,
            exit_code=message.exit_code,
            signal=message.signal,
            message=message.message,
            reason=message.reason,
        )
        self._deliver(observation)

    def _respawn(self, node: str, why: str) -> bool:
        """Start a new agent on live `node` through a one-node step; its instances died with
        the old one (their leaders' parent-death signal), so they are reported killed and
        their restart policies relaunch them there. False when the starter cannot (simulated
        nodes) or `node` used up `MAX_RESPAWNS`: then it is lost."""
        state = self._nodes[node]
        if state.lost is not None:
            return True  # nothing to do: lost for good already
        grown = node in self._growth.grown
        if not self._starter.respawns or grown or state.respawns >= MAX_RESPAWNS:
            return False
        state.respawns += 1
        state.failed = None
        state.ready.clear()
        log.warning(
            "agents: %s; a new one starts there (%d of %d)", why, state.respawns, MAX_RESPAWNS
        )
        self._seal()
        self._answers.fail(node, f"the agent of {node} died while we waited")
        why_exit = f"killed by signal 9 with its agent: {why}"
        self._end_live(node, ObservationKind.EXITED, why_exit, exit_code=128 + 9, signal=9)
        self._starter.respawn(node)
        return True

    def _lose(self, node: str, why: str, *, heard: float | None = None) -> None:
        """`node` is lost: its instances are LOST, its agent told to kill them, for good.

        `heard`: when its agent was last heard (monotonic), if it may live on cut off: its
        instances then count as gone only once its lease and their grace have passed since
        (the observations say when), for it stops them itself only then."""
        state = self._nodes[node]
        if state.lost is not None:
            return
        log.warning("agents: %s", why)
        state.lost = why
        state.ready.set()
        if state.conn is not None:
            state.conn.send(p.Shutdown(why))
            state.conn = None
        self._seal()
        state.cut_off = heard is not None
        lease = self._server.lease if self._server is not None else 0.0
        lost_in_flight = f"node {node} was lost while we waited: {why}"
        if heard is None or lease <= 0:
            self._answers.fail(node, lost_in_flight, lost=True)
            self._end_live(node, ObservationKind.LOST, why)
            return
        names = self._live.on(node)
        grace = max((self._graces.get(n, p.DEFAULT_GRACE) for n in names), default=0.0)
        fenced_in = max(0.0, heard + lease + grace + FENCE_MARGIN - time.monotonic())
        # A launch in flight there may have started too: the largest grace given bounds its.
        in_flight = max(0.0, heard + lease + self._max_grace + FENCE_MARGIN - time.monotonic())
        self._answers.fail(node, lost_in_flight, lost=True, fenced_in=in_flight)
        log.warning(
            "agents: the agent of %s fences its %d instance(s) itself within %.1fs "
            "(lease %gs + grace %gs after its last word)",
            node,
            len(names),
            fenced_in,
            lease,
            grace,
        )
        fence = (
            f"{why}; its agent stops it itself within {fenced_in:.1f}s "
            f"(lease {lease:g}s + grace {grace:g}s after its last word)"
        )
        self._end_live(node, ObservationKind.LOST, fence, extra={"fenced_in": f"{fenced_in:.3f}"})

    def _end_live(
        self,
        node: str,
        kind: ObservationKind,
        why: str,
        exit_code: int | None = None,
        signal: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        """Every instance known to run on `node` is over: forget it and report it so."""
        for name in self._live.on(node):
            live = self._live.get(name)
            if live is None:  # a report of an earlier one ended it meanwhile
                continue
            del self._live[name]
            self._deliver(
                Observation(
                    kind=kind,
                    name=name,
                    attempt=live.attempt,
                    pid=live.pid,
                    message=why,
                    exit_code=exit_code,
                    signal=signal,
                    extra=extra or {},
                )
            )

    def _deliver(self, observation: Observation) -> None:
        # Later, not now: a launch whose answer just arrived resumes first (its task was
        # woken when the answer came), so its exit never overtakes its start. One callback
        # for a run of them (a teardown's 80,000 exits), sealed at each answer (`_seal`).
        if self._listener is None:
            return
        if self._batch is None:
            self._batch = []
            asyncio.get_running_loop().call_soon(self._deliver_batch, self._batch)
        self._batch.append(observation)

    def _deliver_batch(self, batch: list[Observation]) -> None:
        if batch is self._batch:
            self._batch = None
        assert self._listener is not None
        for observation in batch:
            self._listener(observation)

    def _seal(self) -> None:
        """What is observed from now on is delivered after the tasks an answer wakes."""
        self._batch = None


def _capabilities(steps: Backend | None, starter: Starter) -> Capabilities:
    base = steps.capabilities if steps is not None else Capabilities()
    return Capabilities(
        containers=base.containers,
        simulated_nodes=starter.simulated,
        walltime=base.walltime,
        launches_in_flight=LAUNCHES_IN_FLIGHT,
        descriptors=dataclasses.replace(
            starter.descriptors, per_node=starter.descriptors.per_node + FDS_PER_AGENT
        ),
    )


def route_source(ip: str) -> str:
    """The address of this machine on the route to `ip`: what agents there can dial."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # UDP: no packet is sent; the kernel only picks a route
        return str(probe.getsockname()[0])
