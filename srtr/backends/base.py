"""The narrow interface between controllers and whatever really runs processes.

Controllers import only this module. `local/` runs instances as process groups on this
machine, `slurm/` as srun steps, `agent/` through a node agent per node, and `fake.py`
scripts exits for controller tests. A backend reports what happened through the listener it
was given; it never decides anything.

Everything the controllers and the runtime ask of a backend is in `Backend`; what only some
backends can do is declared in their `Capabilities`, never found out by probing for methods.
"""

from __future__ import annotations

import enum
import importlib.util
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class NodeInfo:
    """One node of the allocation, in allocation order."""

    name: str
    ip: str


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a backend needs to start one attempt of one instance.

    `argv` is never passed through a shell. When `preamble` is set the backend runs
    `bash -c '<preamble>\\nexec "$@"' srtr-<name> <argv...>` so the preamble is shell
    text but the argv stays an argv. When `shell` is set, `argv` is a single shell command
    line (the benchmark step) and runs as `bash -c <argv[0]>`.
    """

    name: str
    node: str
    node_ip: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    attempt: int = 0
    preamble: str | None = None
    shell: bool = False
    container: str | None = None
    cwd: Path | None = None
    # srun only; the local backend ignores them.
    cpus_per_task: int | None = None
    cpu_bind: str | None = None
    srun_options: Mapping[str, str] = field(default_factory=dict)
    # The part of `env` the recipe asked to pass through srun's --export (srun_export_env).
    # It is already in `env`; the agent backend keeps such an instance on a step of its own.
    export_env: Mapping[str, str] = field(default_factory=dict)
    # SIGTERM to SIGKILL: what a node agent that fences itself gives the attempt (it decides
    # alone, cut off from the controller that keeps the grace).
    stop_grace_seconds: float = 30.0
    # `limits.memory` in bytes: a memory cgroup of its own (local, agent); srun's --mem.
    memory_limit: int | None = None


class ObservationKind(enum.StrEnum):
    STARTED = "Started"
    EXITED = "Exited"
    LOST = "Lost"


@dataclass(frozen=True)
class Observation:
    """A fact a backend saw about one attempt of one instance.

    `exit_code` follows the shell convention for EXITED: 0..255 for a normal exit and
    128+n when the process was killed by signal n (`signal` is then set too).
    """

    kind: ObservationKind
    name: str
    attempt: int
    pid: int | None = None
    step: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    # What ended it, when the backend knows more than the code: OOMKilled (the kernel's OOM
    # killer, seen in the instance's memory cgroup or SLURM's step state); '' otherwise.
    reason: str = ""


Listener = Callable[[Observation], None]

# What identifies a live attempt's process across controllers (local: pid and kernel start
# time); saved in state.json, handed back to `Backend.adopt` by the next controller.
Identity = dict[str, int]


@dataclass(frozen=True)
class Descriptors:
    """The controller's open files a backend holds per node and per live instance.

    Counted on running jobs (`/proc/PID/task/*/fd`). The controller has two descriptor
    tables, each bounded by RLIMIT_NOFILE on its own: its main one (agent connections, node
    views, a probe's socket or a log being opened), and the exit watcher's
    (`exit_watch.py`: a pidfd per process the controller itself started and waits for).
    The defaults are a process per instance started by the controller (the local and step
    launchers).
    """

    per_node: int = 1
    per_instance: int = 1
    watched_per_node: int = 0
    watched_per_instance: int = 1


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond launching and signalling; callers check these flags.

    Attributes:
        containers: `LaunchSpec.container` images are run (SLURM with pyxis); otherwise they
            are ignored and the instance runs on the host.
        simulated_nodes: nodes are simulated, so `lose_node` can fail one on request.
        walltime: the allocation has a time limit that `end_time` may report.
        launches_in_flight: how many launches the controllers may await at once. A launch
            that waits for a remote answer (an agent's `Launched`) costs a round trip, and a
            thousand of them one after another cost a thousand round trips. 0: each launch
            is awaited in its reconcile, one at a time (a backend whose launch never waits).
        max_instances: the most instances the backend can hold at once (None: no cap of
            its own); a live edit beyond it is refused.
        descriptors: the controller's open files per node and per instance; a job that
            cannot fit the host's limit is refused at start (`runtime/descriptors.py`).
    """

    containers: bool = False
    simulated_nodes: bool = False
    walltime: bool = False
    launches_in_flight: int = 0
    max_instances: int | None = None
    descriptors: Descriptors = field(default_factory=Descriptors)


class LaunchError(Exception):
    """The backend could not start the instance at all (missing binary, bad cwd, ...).

    The message is shown to the user; controllers treat it like an exit with code 127.
    """


class NodeLostError(LaunchError):
    """The instance's node is lost: nothing starts there again. Controllers count the
    instance lost with its node (as if it had been running there), not an exit with code
    127 that its restart policy would retry on the same dead node.

    `fenced_in`: for a launch that was in flight when its node was cut off, the seconds
    until that node's agent has stopped whatever it started (as `Observation.extra`'s).
    """

    def __init__(self, message: str, *, fenced_in: float | None = None) -> None:
        super().__init__(message)
        self.fenced_in = fenced_in


def host_has_program(what: str, name: str) -> bool:
    """`Backend.has_program` as this host answers it (the controller's host: where the local
    backend runs everything, and what a cluster's nodes are taken to share)."""
    if what == "module":
        return importlib.util.find_spec(name) is not None
    return shutil.which(name) is not None


class Backend(Protocol):
    """What controllers may ask of a backend. All methods are called on the event loop."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do; fixed for its lifetime."""
        ...

    @property
    def owns_allocation(self) -> bool:
        """True when the backend asked for its allocation and releases it in `close`.

        Saved in state.json, so the job's guard knows to release it after a crash.
        """
        ...

    def nodes(self) -> list[NodeInfo]:
        """The allocation's nodes in allocation order."""
        ...

    def set_listener(self, listener: Listener) -> None:
        """Where observations go. Called once, before the first launch."""
        ...

    async def launch(self, spec: LaunchSpec) -> int:
        """Start one attempt; return its pid. Raises LaunchError when it cannot start.

        A STARTED observation is not required: the returned pid is the start. The matching
        EXITED observation arrives through the listener whenever the attempt ends.
        """
        ...

    async def signal(self, name: str, signum: int) -> None:
        """Send `signum` to every process of the instance's running attempt. No-op if none."""
        ...

    def running(self) -> set[str]:
        """Names of instances that have a live attempt right now."""
        ...

    def identity(self, name: str) -> Identity | None:
        """What `adopt` needs to find the live attempt of `name` again after a controller
        crash, or None when it cannot be adopted (no live attempt, or not adoptable)."""
        ...

    async def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """Watch attempt `attempt` of `name`, started by an earlier controller, if `identity`
        still names a live process; False when it is gone (or adoption is unsupported)."""
        ...

    async def end_time(self) -> float | None:
        """When the allocation's time limit ends (epoch seconds), or None when it has none.

        Only backends with `capabilities.walltime` ever return a time.
        """
        ...

    def has_program(self, what: str, name: str) -> bool:
        """Whether the nodes can run `name`: a binary on PATH (`what` "binary") or a
        top-level Python package (`what` "module"). Asked once per program per job."""
        ...

    def lose_node(self, node: str) -> list[str]:
        """Fail `node` now: kill its attempts, report them LOST, launch nothing there again.
        Returns the names of the instances it took.

        Raises:
            ValueError: no such node, or the backend has no `capabilities.simulated_nodes`.
        """
        ...

    async def close(self) -> None:
        """SIGKILL whatever still runs and wait for it to be reaped. Idempotent."""
        ...
