"""Process groups on this machine: start, watch, signal and reap them; no policy.

Both backends compose a `ProcessGroups`: the local backend's attempts are the instances
themselves, the SLURM backend's are the srun clients of its steps. The backend says which argv
and environment start an attempt, and what a reaped attempt means (EXITED, LOST): every exit
goes to the `on_exit` handler it was given, after the attempt has left the live set.

`start` runs one attempt in a new session, so the attempt's process group id is its pid and a
signal reaches the whole group. Exits are seen through one pidfd per live leader, all held
by one thread (`exit_watch`: in its own fd table, so that the table every launch copies
stays small), not a thread per child: asyncio's default child watcher on Python 3.11 starts
one per child, which does not scale to thousands of instances. Costs worth knowing: one
pidfd per live attempt (the controller's open-file limit bounds the job). How one process
is started, reaped and described is `spawn`'s.

An attempt an earlier controller started can be taken over (`adopt`) by pid and kernel start
time; it is not our child, so its exit status is unknown (`on_exit` gets None).

`instance_command` and `instance_environment` say how an instance runs as a process of this
machine: the local backend and the node agent (`backends/agent/node.py`) start them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from srtr.backends.base import Identity, LaunchError, LaunchSpec, Observation, ObservationKind
from srtr.backends.cgroups import MemoryCgroups
from srtr.backends.exit_watch import exit_watcher
from srtr.backends.spawn import ExitStatus as ExitStatus
from srtr.backends.spawn import (
    append_note,
    close_inherited_on_exec,
    environ_of,
    group_exists,
    open_log,
    parent_death_hook,
    reap,
    spawn,
    start_popen,
)
from srtr.backends.spawn import kill_group as kill_group
from srtr.backends.spawn import process_start_time as process_start_time

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0
# Only these are taken from the starting process's environment by default: anything else
# (tokens, SLURM_*, the user's experiments) must come from the recipe so a run is reproducible.
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "PYTHONPATH")


def inherited_environment() -> dict[str, str]:
    """The `INHERITED_ENV` variables this process has."""
    return {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}


# Below this many lingering groups, pruning is not worth a syscall per group.
_PRUNE_MIN = 64


@dataclass(slots=True)
class Attempt:
    """One started attempt whose leader has not been reaped yet."""

    name: str
    attempt: int
    node: str  # "" when unknown (an adopted attempt without SRTR_NODE)
    pid: int
    # Equal to pid (the child calls setsid), kept apart to make the killpg calls read right.
    pgid: int
    # Our child (we reap it and know its status), or adopted from an earlier controller.
    child: bool
    # The Popen of a child started through subprocess, kept so that we can set its
    # returncode after reaping: an unreaped-looking Popen that is garbage collected goes to
    # subprocess._active, whose waitpid(pid) could later reap an unrelated child that reused
    # the pid. None for a posix_spawn'd child and an adopted attempt.
    popen: subprocess.Popen[bytes] | None
    loop: asyncio.AbstractEventLoop
    watch: int = 0  # its key in the exit watcher, once watched


# Told about every reaped attempt; the status is None for an adopted one (not our child).
ExitHandler = Callable[[Attempt, ExitStatus | None], None]
CommandBuilder = Callable[[LaunchSpec], list[str]]
EnvironmentBuilder = Callable[[LaunchSpec], dict[str, str]]


def exited(attempt: Attempt, status: ExitStatus | None) -> Observation:
    """The EXITED observation of a reaped attempt (exit code None when it was adopted)."""
    if status is None:
        return Observation(
            kind=ObservationKind.EXITED,
            name=attempt.name,
            attempt=attempt.attempt,
            pid=attempt.pid,
            exit_code=None,
            message="exit status unknown: adopted from an earlier controller",
        )
    return Observation(
        kind=ObservationKind.EXITED,
        name=attempt.name,
        attempt=attempt.attempt,
        pid=attempt.pid,
        exit_code=status.code,
        signal=status.signal,
        message=status.message,
        reason=status.reason,
    )


# Signals that ask a process to end: sent with a SIGCONT after them.
_ENDING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


class ProcessGroups:
    """At most one live attempt per instance name, each a process group of its own."""

    def __init__(
        self,
        on_exit: ExitHandler,
        *,
        command: CommandBuilder,
        environment: EnvironmentBuilder,
        owner: str,
        die_with_parent: bool = False,
        memory_cgroups: bool = True,
    ) -> None:
        """
        Args:
            on_exit: told about every reaped attempt (see ExitHandler).
            command: the argv that starts an attempt; may raise LaunchError.
            environment: the environment of the started process.
            owner: the backend's name, for messages.
            die_with_parent: each leader gets SIGKILL when this process dies (Linux's
                parent-death signal), so a node agent killed by `kill -9` takes its
                instances' leaders with it. Members a leader forked are not covered.
            memory_cgroups: attempts with a memory limit run in a memory cgroup of their
                own, and OOM kills are told apart (`cgroups.py`); False where the attempts
                are not the instances (the SLURM backend's srun clients).
        """
        self._on_exit = on_exit
        self._command = command
        self._environment = environment
        self._owner = owner
        self._preexec = parent_death_hook() if die_with_parent else None
        if self._preexec is None:
            close_inherited_on_exec()  # `spawn` has no close_fds
        self._cgroups = MemoryCgroups(enabled=memory_cgroups)
        self._watcher = exit_watcher()  # started here, not in a launch inside a node's view
        self._live: dict[str, Attempt] = {}
        # Groups whose leader was reaped while other members (grandchildren) remained. Only
        # close() kills them; signal() targets the live attempt alone.
        self._lingering: set[int] = set()
        self._prune_at = _PRUNE_MIN
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __contains__(self, name: str) -> bool:
        return name in self._live

    def get(self, name: str) -> Attempt | None:
        return self._live.get(name)

    def names(self) -> set[str]:
        return set(self._live)

    def attempts(self) -> list[Attempt]:
        return list(self._live.values())

    def start(self, spec: LaunchSpec) -> Attempt:
        """Start one attempt as a new session with its output appended to `spec.log_path`.

        Must be called on the event loop, which then watches the attempt's exit.

        Raises:
            LaunchError: closed, the instance still has a live attempt, the log cannot be
                opened, or the process cannot be started (the message is also appended to
                the log when the log could be opened).
        """
        if self._closed:
            raise LaunchError(f"cannot start {spec.name!r}: the {self._owner} backend is closed")
        previous = self._live.get(spec.name)
        if previous is not None:
            raise LaunchError(
                f"cannot start {spec.name!r} attempt {spec.attempt}: attempt {previous.attempt}"
                f" (pid {previous.pid}) has not exited yet"
            )
        loop = asyncio.get_running_loop()
        fd = open_log(spec.log_path)
        try:
            if spec.attempt > 0:
                # Here, not at the top: rundir (and the status model) weighs on every node
                # agent's start, and only a restart writes a marker.
                from srtr.store.rundir import restart_marker

                marker = restart_marker(
                    instance=spec.name, attempt=spec.attempt, node=spec.node, at=datetime.now(UTC)
                )
                append_note(fd, marker)
            try:
                argv = self._cgroups.argv(spec, self._command(spec))
                env = self._environment(spec)
                if self._preexec is None and spec.cwd is None:
                    attempt = _attempt(spec, spawn(spec, fd, argv, env), None, loop)
                else:
                    popen = start_popen(spec, fd, argv, env, self._preexec)
                    attempt = _attempt(spec, popen.pid, popen, loop)
                self._register_child(attempt)
            except LaunchError as exc:
                append_note(fd, f"==== srtr: {exc} ====\n")
                raise
        finally:
            os.close(fd)
        return attempt

    def signal(self, name: str, signum: int) -> None:
        """Send `signum` to the group of the live attempt of `name`; no-op if there is none."""
        attempt = self._live.get(name)
        if attempt is None:
            return
        self._cgroups.signalled(name, signum)
        # The leader is not reaped yet, so its pid (the group id) cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.pgid, signum)
            if signum in _ENDING:
                # A stopped process (SIGSTOP, a debugger let go of) would hold the signal
                # until its grace ran out; woken, it handles it now, as systemd does.
                os.killpg(attempt.pgid, signal.SIGCONT)

    def identity(self, name: str) -> Identity | None:
        """pid and kernel start time of the live attempt: what adoption checks later."""
        attempt = self._live.get(name)
        if attempt is None:
            return None
        start = process_start_time(attempt.pid)
        return {"pid": attempt.pid, "start": start} if start is not None else None

    def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """Watch an attempt an earlier controller started, if it is still that process.

        The pid alone could have been reused; the kernel start time makes the match exact.
        Must be called on the event loop.
        """
        pid, start = identity.get("pid"), identity.get("start")
        if not pid or start is None or process_start_time(pid) != start:
            return False
        try:
            adopted = Attempt(
                name=name,
                attempt=attempt,
                node=environ_of(pid).get("SRTR_NODE", ""),
                pid=pid,
                pgid=os.getpgid(pid),
                child=False,
                popen=None,
                loop=asyncio.get_running_loop(),
            )
            self._register(adopted)
        except OSError:  # gone meanwhile
            return False
        return True

    async def wait_idle(self, within: float) -> bool:
        """Wait up to `within` seconds for every live attempt to exit; True when none is left."""
        try:
            async with asyncio.timeout(within):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """SIGKILL every group we started, lingering ones too, and wait for the leaders' exits.

        Exits seen meanwhile are still reported to `on_exit`. Leaders that are not reaped
        within a few seconds (stuck in the kernel) are abandoned with a warning.
        """
        self._closed = True
        for attempt in self._live.values():
            kill_group(attempt.pgid)
        for pgid in self._lingering:
            kill_group(pgid)
        self._lingering.clear()
        if self._live:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._idle.wait()
            except TimeoutError:
                self._abandon()
        self._cgroups.close()

    def _register_child(self, attempt: Attempt) -> None:
        """`_register` a child just started; one whose exit cannot be watched is killed."""
        try:
            self._register(attempt)
        except OSError as exc:
            # An attempt whose exit we could never observe must not be left running.
            kill_group(attempt.pid)
            if attempt.popen is not None:
                attempt.popen.wait()
            else:
                reap(attempt.pid)
            raise LaunchError(f"cannot watch {attempt.name!r} (pid {attempt.pid}): {exc}") from exc

    def _register(self, attempt: Attempt) -> None:
        """Watch the attempt's exit; OSError if its pidfd cannot be opened."""
        attempt.watch = self._watcher.watch(
            attempt.pid, attempt.loop, functools.partial(self._on_exited, attempt)
        )
        self._live[attempt.name] = attempt
        self._idle.clear()

    def _on_exited(self, attempt: Attempt) -> None:
        """The watcher saw the leader exit: it is a zombie (or gone, if not ours); reap it."""
        if not attempt.child:
            # Not our child: init reaps it and keeps the status; the group may be gone.
            kill_group(attempt.pgid)
            self._forget(attempt)
            self._on_exit(attempt, None)
            return
        # An instance ends with its main process, as a container does: leftovers of the
        # group (a backgrounded child holding a port) would break the next attempt. The
        # unreaped leader keeps the group id from being reused, so this cannot hit a stranger.
        kill_group(attempt.pgid)
        status = reap(attempt.pid)
        oom = self._cgroups.reason(attempt.name, status, attempt.pid)
        status = dataclasses.replace(status, reason=oom) if oom else status
        if attempt.popen is not None:
            attempt.popen.returncode = -status.signal if status.signal is not None else status.code
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        self._note_lingering(attempt.pgid)
        if not self._live:
            self._idle.set()
        self._on_exit(attempt, status)

    def _forget(self, attempt: Attempt) -> None:
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        if not self._live:
            self._idle.set()

    def _note_lingering(self, pgid: int) -> None:
        # Once a group is empty its number is a free pid that an unrelated process may reuse as
        # its own group id, so forget empty groups as soon as we notice them. The check right
        # after reaping is exact; the amortised prune keeps each exit O(1) on average. After
        # close() every group has been SIGKILLed already.
        if self._closed or not group_exists(pgid):
            return
        self._lingering.add(pgid)
        if len(self._lingering) >= self._prune_at:
            self._lingering = {g for g in self._lingering if group_exists(g)}
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._lingering))

    def _abandon(self) -> None:
        stuck = list(self._live.values())
        log.warning(
            "%s backend: %d process(es) not reaped %.0fs after SIGKILL, abandoning: %s",
            self._owner,
            len(stuck),
            CLOSE_TIMEOUT,
            ", ".join(f"{a.name} (pid {a.pid})" for a in stuck),
        )
        for attempt in stuck:
            self._watcher.unwatch(attempt.watch)
        # Their Popen objects keep returncode None on purpose: subprocess then reaps them later
        # (a posix_spawn'd one stays a zombie until we exit: it did not die of SIGKILL anyway).
        self._live.clear()
        self._idle.set()


def instance_command(spec: LaunchSpec) -> list[str]:
    """The argv that runs an instance attempt as a process here (see LaunchSpec).

    Raises:
        LaunchError: an empty argv, or a shell launch that is not one command line.
    """
    if spec.shell:
        if len(spec.argv) != 1:
            raise LaunchError(
                f"cannot start {spec.name!r}: a shell launch takes exactly one command line,"
                f" got {len(spec.argv)} arguments"
            )
        script = spec.argv[0] if spec.preamble is None else f"{spec.preamble}\n{spec.argv[0]}"
        return ["bash", "-c", script]
    if not spec.argv:
        raise LaunchError(f"cannot start {spec.name!r}: empty argv")
    if spec.preamble is not None:
        # The argv travels as "$@", so it is never split or expanded by the shell.
        return ["bash", "-c", spec.preamble + '\nexec "$@"', "srtr-" + spec.name, *spec.argv]
    return list(spec.argv)


def instance_environment(spec: LaunchSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """An instance attempt's environment: `inherited`, the spec's env, then srtr's own
    SRTR_NODE, SRTR_NODE_IP and SRTR_INSTANCE."""
    env = dict(inherited)
    env.update(spec.env)
    env["SRTR_NODE"] = spec.node
    env["SRTR_NODE_IP"] = spec.node_ip
    env["SRTR_INSTANCE"] = spec.name
    return env


def _attempt(
    spec: LaunchSpec,
    pid: int,
    popen: subprocess.Popen[bytes] | None,
    loop: asyncio.AbstractEventLoop,
) -> Attempt:
    return Attempt(
        name=spec.name,
        attempt=spec.attempt,
        node=spec.node,
        pid=pid,
        pgid=pid,
        child=True,
        popen=popen,
        loop=loop,
    )
