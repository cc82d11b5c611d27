"""What a starter of node agents is (`Starter`), what it tells the backend (`Events`), and
what every starter hands its agents: their command line, their credentials, the run dir's
file names. The starters themselves are in `starters.py` (local, SLURM) and
`hollow_starter.py` (hollow mode).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Protocol

from srtr.backends.agent.protocol import TOKEN_ENV
from srtr.backends.base import Descriptors, LaunchSpec, NodeInfo
from srtr.backends.procgroup import inherited_environment
from srtr.net.tls import FINGERPRINT_ENV

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
    # The job certificate's fingerprint the agents pin (`srtr.net.tls`); set by the backend
    # before `start`; "" for a channel in the clear (tests of the protocol alone).
    fingerprint: str
    # A node whose agent died can get a new one (`respawn`). Not a simulated node: its agent
    # is the node, and its death is the node's loss.
    respawns: bool
    # The controller's descriptors per node this starter holds, besides the agent's own
    # connection (`channel.FDS_PER_AGENT`, counted by the backend).
    descriptors: Descriptors

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


def agent_env(token: str, fingerprint: str, run_dir: Path) -> dict[str, str]:
    """What srtr puts in an agent's environment: its credentials (never its argv: the token,
    and the certificate fingerprint it pins), and the run dir."""
    secrets = {TOKEN_ENV: token, **({FINGERPRINT_ENV: fingerprint} if fingerprint else {})}
    return {**secrets, "SRTR_RUN_DIR": str(run_dir.resolve())}


def verbatim(spec: LaunchSpec) -> list[str]:
    return list(spec.argv)


def local_environment(spec: LaunchSpec) -> dict[str, str]:
    """A local agent process's environment: the inherited few, then the spec's (the token)."""
    return {**inherited_environment(), **spec.env}


def agent_command(
    address: tuple[str, int], run_dir: Path, window: float, *where: str
) -> tuple[str, ...]:
    host, port = address
    rendezvous = run_dir / RENDEZVOUS
    adopt = ("--adopt-window", f"{window:g}", "--rendezvous", str(rendezvous.resolve()))
    return (sys.executable, "-m", MODULE, "--controller", f"{host}:{port}", *adopt, *where)
