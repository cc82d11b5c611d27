"""The local backend: every instance attempt is a process group on this machine.

It owns the processes it starts and nothing else. Starting, watching (one pidfd per live
leader), signalling and reaping the groups is `procgroup.ProcessGroups`'s; this module says
which argv and environment start an attempt and what an exit means.

Nodes are simulated: node K is `nodeK` with the loopback IP 127.B.0.1 + K, where 127.B.0.0/16
is the job's own block (`loopback.py`; 127.0.0.1 + K for a job alone), so services that bind
to `{node_ip}` collide neither with each other nor with another local job's. Once a job has a
run dir (`isolate_nodes`), each node also gets its own view of the machine where the kernel
allows (`node_tmp`): every host path, and its own writes under /tmp; one mount namespace per
node, which every instance of the node enters with one exec.
The CLI constructs this backend; controllers see it only as
a `srtr.backends.base.Backend`.

A simulated node cannot fail by itself, so `lose_node` fails one on request (the control
socket's `lose-node` op): its attempts are killed and reported LOST, as the SLURM backend
reports the steps of a node that went DOWN, and nothing launches there again.

A controller that dies (kill -9) leaves its instances running on purpose, so that
`srtr up --adopt` can take them over with 0 restarts (`adopt`, by pid and kernel start
time). The job's guard process (`srtr.runtime.guard`) kills them if no controller adopts them within
the adoption window, so nothing outlives a crashed controller for long.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from srtr.backends.base import (
    Capabilities,
    Identity,
    LaunchSpec,
    Listener,
    NodeInfo,
    NodeLostError,
    Observation,
    ObservationKind,
    host_has_program,
)
from srtr.backends.local.loopback import BLOCK_NODES, LoopbackBlock
from srtr.backends.local.node_tmp import NodeTmp
from srtr.backends.procgroup import (
    Attempt,
    ExitStatus,
    ProcessGroups,
    exited,
    inherited_environment,
    instance_command,
    instance_environment,
    kill_group,
)

# Every instance is a process group of this machine, with its descriptors: a live edit that
# asks for more (`nodes: 100000`) is refused rather than tried (docs/recipe.md, Live edits).
MAX_INSTANCES = 8192


class LocalBackend:
    """Runs instances as process groups on this machine, on simulated loopback nodes."""

    name = "local"
    capabilities = Capabilities(simulated_nodes=True, max_instances=MAX_INSTANCES)

    def __init__(
        self, node_count: int, grown: Sequence[NodeInfo] = (), block: LoopbackBlock | None = None
    ) -> None:
        """Simulate `node_count` nodes: `node1`..`nodeN` on the loopback block's addresses
        (`loopback.py`; none given: block 0, 127.0.0.2 upwards), then `grown` (an adopted
        job's nodes from grow requests, as its state recorded them).

        Raises:
            ValueError: node_count is below 1 or does not fit in the block.
        """
        if not 1 <= node_count <= BLOCK_NODES:
            raise ValueError(
                f"node_count must be between 1 and {BLOCK_NODES} (a local job's loopback block)"
            )
        self.block = block if block is not None else LoopbackBlock()
        self._nodes = [
            NodeInfo(name=f"node{k}", ip=self.block.ip(k)) for k in range(1, node_count + 1)
        ] + list(grown)
        self._listener: Listener | None = None
        self._groups = ProcessGroups(
            self._exited, command=self._command, environment=self._environment, owner=self.name
        )
        self._node_tmp: NodeTmp | None = None
        self._lost_nodes: set[str] = set()
        self._lost_attempts: set[tuple[str, int]] = set()  # (name, attempt) killed with a node
        # Nodes a grow request added (`add_nodes`): the node helper made its views at start,
        # so these get a TMPDIR of their own but no mount view of their own yet.
        self._added: set[str] = set()

    async def add_nodes(self, nodes: Sequence[NodeInfo]) -> None:
        """Nodes a provisioner granted join the allocation, after its last node.

        Raises:
            ValueError: a node of that name is already in the allocation.
        """
        known = {n.name for n in self._nodes}
        for node in nodes:
            if node.name in known:
                raise ValueError(f"node {node.name!r} is already in the allocation")
            known.add(node.name)
        self._nodes += list(nodes)
        self._added.update(n.name for n in nodes)

    async def remove_nodes(self, names: Sequence[str]) -> None:
        """Nodes given back to the provisioner leave the allocation; nothing may run there.

        Raises:
            ValueError: a node was not added by `add_nodes`, or still runs an attempt.
        """
        for name in names:
            if name not in self._added:
                raise ValueError(f"node {name!r} did not come from a grow request")
            busy = sorted(a.name for a in self._groups.attempts() if a.node == name)
            if busy:
                raise ValueError(f"node {name!r} still runs {', '.join(busy)}")
        gone = set(names)
        self._nodes = [n for n in self._nodes if n.name not in gone]
        self._added -= gone

    def isolate_nodes(self, root: Path, *, shared: Sequence[Path] = ()) -> str:
        """Give each simulated node its own /tmp under `root` (`<run dir>/nodes`): a view of
        the machine with its own /tmp writes where the kernel allows, else TMPDIR (see
        `node_tmp`); the views are made from now on, while the job starts. `shared`: more
        dirs that stay the host's own on every node. Returns how."""
        self._node_tmp = NodeTmp(root, [node.name for node in self._nodes], shared=shared)
        return (root / "isolation.txt").read_text().strip()

    @property
    def node_tmp(self) -> NodeTmp | None:
        """The nodes' views once `isolate_nodes` ran (node agents start inside them)."""
        return self._node_tmp

    def _command(self, spec: LaunchSpec) -> list[str]:
        argv = instance_command(spec)
        if self._node_tmp is None or spec.node in self._added:
            return argv
        wrapped = self._node_tmp.enter(spec.node, argv, here=True)
        if wrapped is not argv and shutil.which(argv[0], path=spec.env.get("PATH")) is None:
            # A program that cannot be found fails the launch as it always did (LaunchError),
            # not as an exit of the wrapper's shell.
            return argv
        return wrapped

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        inherited = inherited_environment()
        if self._node_tmp is not None:
            inherited["TMPDIR"] = self._node_tmp.tmpdir(spec.node)
        return instance_environment(spec, inherited)

    @property
    def owns_allocation(self) -> bool:
        return False

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    def running(self) -> set[str]:
        return self._groups.names()

    async def launch(self, spec: LaunchSpec) -> int:
        """Start one attempt as a new session with its output appended to `spec.log_path`.

        Returns:
            The pid of the attempt's leader, which is also its process group id.

        Raises:
            LaunchError: the backend is closed, the node is lost, the instance still has a
                live attempt, the log cannot be opened, or the process cannot be started (the
                message is also appended to the log when the log could be opened).
        """
        if spec.node in self._lost_nodes:
            raise NodeLostError(f"cannot start {spec.name!r}: node {spec.node} is lost")
        if self._node_tmp is None or spec.node in self._added:
            return self._groups.start(spec).pid
        await self._node_tmp.prepare(spec.node)
        with self._node_tmp.entered(spec.node):  # as root: no nsenter exec per launch
            return self._groups.start(spec).pid

    async def signal(self, name: str, signum: int) -> None:
        self._groups.signal(name, signum)

    def lose_node(self, node: str) -> list[str]:
        """Fail simulated `node`: SIGKILL every attempt on it, report each exit as LOST, and
        refuse launches there from now on. Returns the names of the instances it took.

        Raises:
            ValueError: the allocation has no node of that name.
        """
        if node not in {n.name for n in self._nodes}:
            raise ValueError(f"no node named {node!r}")
        self._lost_nodes.add(node)
        taken = [a for a in self._groups.attempts() if a.node == node]
        for attempt in taken:
            self._lost_attempts.add((attempt.name, attempt.attempt))
            kill_group(attempt.pgid)
        return sorted(a.name for a in taken)

    async def close(self) -> None:
        """SIGKILL every group we started, lingering ones too, and wait for the leaders' exits.

        Exits seen meanwhile are still reported to the listener. Leaders that are not reaped
        within a few seconds (stuck in the kernel) are abandoned with a warning.
        """
        await self._groups.close()
        if self._node_tmp is not None:
            self._node_tmp.close()

    def identity(self, name: str) -> Identity | None:
        """pid and kernel start time of the live attempt: what adoption checks later."""
        return self._groups.identity(name)

    async def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """Watch an attempt an earlier controller started, if it is still that process.

        The pid alone could have been reused; the kernel start time makes the match exact.
        The process is not our child, so its exit status cannot be read: its exit is
        reported with `exit_code=None`.
        """
        adopted = self._groups.adopt(name, attempt, identity)
        live = self._groups.get(name)
        if adopted and live is not None and live.node and self._node_tmp is not None:
            # The node's next launches join the adopted instance's view, and its /tmp.
            self._node_tmp.adopt(live.node, live.pid)
        return adopted

    def has_program(self, what: str, name: str) -> bool:
        return host_has_program(what, name)

    async def end_time(self) -> float | None:
        """None: a local job has no time limit."""
        return None

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        """A reaped attempt: LOST when `lose_node` killed it, else EXITED."""
        if self._listener is not None:
            self._listener(self._lost_observation(attempt) or exited(attempt, status))

    def _lost_observation(self, attempt: Attempt) -> Observation | None:
        """LOST for an attempt `lose_node` killed, else None."""
        if (attempt.name, attempt.attempt) not in self._lost_attempts:
            return None
        self._lost_attempts.discard((attempt.name, attempt.attempt))
        return Observation(
            kind=ObservationKind.LOST,
            name=attempt.name,
            attempt=attempt.attempt,
            pid=attempt.pid,
            message=f"node {attempt.node} was lost (simulated)",
        )
