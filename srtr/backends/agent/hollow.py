"""Hollow mode (kubemark-style): many node agents in one process, for scale tests.

    SRTR_AGENT_TOKEN=... python -m srtr.backends.agent.hollow --controller HOST:PORT \\
        --nodes node1,node2,... [--control FIFO] [--log-dir DIR] [--adopt-window S --rendezvous F]

Each simulated node is the real `node.Agent`, with its own TCP connection, handshake and
heartbeats: the controller cannot tell it from a real node. Only what the agent runs is
simulated (`SimulatedProcesses`, the agent's `Runner`): an instance attempt forks nothing; it
"runs" until it is signalled, and reports its start and exit through the agent's real code
paths. So one machine can stand in for a thousand nodes and four thousand instances.

A simulated attempt, like a process with default signal handlers:

- SIGKILL ends it at once (killed by SIGKILL, 137); SIGTERM too (143), unless its
  environment says otherwise: `SRTR_HOLLOW_ON_TERM=ignore` ignores it (the controller's grace
  then ends in SIGKILL), `SRTR_HOLLOW_ON_TERM=SECONDS` handles it and exits 0 that much later;
- signals whose default action is to ignore (SIGCHLD, SIGCONT, SIGURG, SIGWINCH) and the
  stop signals do nothing; every other signal kills it;
- it writes one line into its log (after the restart marker, as a real attempt's log has);
- its pid is a number above Linux's largest pid, so no real process is ever named by it.

Probes of simulated instances succeed at once (`SimulatedProbes`): nothing listens. The
control line `unhealthy INSTANCE` makes every probe of that instance fail until `healthy
INSTANCE`: a hung instance, for the liveness and readiness loops the agents run.

The control FIFO (`--control`, in the 0700 run dir) takes one command a line:

- `kill NODE`: the node dies: its connection is dropped without a goodbye and its
  instances vanish unreported, as when a machine loses power;
- `freeze NODE`: the node goes silent (no heartbeats, no answers) with its connection open;
- `exit INSTANCE CODE`: that instance's live attempt exits with CODE;
- `unhealthy INSTANCE`, `healthy INSTANCE`: its probes fail from now on, or pass again;
- `add NODE`: a node a grow request brought: a new agent for it dials the controller;
- `remove NODE`: a node that went back to its provider: its agent ends (if the controller's
  Shutdown has not ended it already).

The process serves until its last agent ended, added ones included. On SIGTERM every agent
stops its instances and reports their exits, and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import contextlib
import functools
import itertools
import logging
import os
import signal
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from srtr.backends.agent import protocol as p
from srtr.backends.agent import relay
from srtr.backends.agent.node import (
    Agent,
    EnvironmentOf,
    ExitReport,
    Runner,
    Session,
    Started,
)
from srtr.backends.base import LaunchError, LaunchSpec
from srtr.backends.procgroup import ExitStatus
from srtr.net import tls
from srtr.resources.objects import ProbeSpec
from srtr.store.rundir import restart_marker

log = logging.getLogger("srtr.agent")

ON_TERM_ENV = "SRTR_HOLLOW_ON_TERM"
# Above Linux's largest pid (2^22): a simulated pid can never name a real process.
_PIDS = itertools.count(1 << 23)
_IGNORED = frozenset(
    {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH, signal.SIGSTOP}
    | {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
)
# At most this many agents do their handshake at once: a thousand at the same moment only
# overflow the controller's accept queue and wait for TCP's SYN retries.
JOIN_GATE = 256
# What each agent's TLS connection reads at once. asyncio's default (`SSLProtocol.max_size`,
# 256 KiB, allocated and zeroed per connection) was 2.5 GB of the hollow process at 10,000
# agents and a tenth of its CPU during the joins; a controller's messages to an agent are a
# few KB, and a longer one is read in more than one go. Nothing changes on the wire.
TLS_READ = 16 * 1024


@dataclass(eq=False)
class SimulatedAttempt:
    name: str
    attempt: int
    pid: int
    start: int  # stands for the kernel start time adoption compares
    on_term: str  # "die", "ignore", or the seconds until it exits 0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


# Simulated exits end a slice per turn of the loop, in the order they were due: a teardown's
# 80,000 SIGTERMs ended in one turn held every node's heartbeat back ~3 s, and the
# controller lost thousands of them as silent. (A real node's agent is a process of its own.)
ENDS_PER_TURN = 500
_ENDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, deque[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def _end_soon(loop: asyncio.AbstractEventLoop, end: Callable[[], None]) -> None:
    queue = _ENDS.get(loop)
    if queue is None:
        queue = _ENDS[loop] = deque()
        loop.call_soon(_end_some, loop, queue)
    queue.append(end)


def _end_some(loop: asyncio.AbstractEventLoop, queue: deque[Callable[[], None]]) -> None:
    for _ in range(min(ENDS_PER_TURN, len(queue))):
        queue.popleft()()
    if queue:
        loop.call_soon(_end_some, loop, queue)
    else:
        del _ENDS[loop]


@functools.cache  # one per signal: a teardown asks for it 80,000 times at 10,000 x 8
def _status(signum: int) -> ExitStatus:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return ExitStatus(128 + signum, signum, f"killed by {name}")


class SimulatedProcesses:
    """A node's instance attempts, simulated: the `node.Runner` of hollow mode."""

    def __init__(self, node: str, on_exit: ExitReport, environment: EnvironmentOf) -> None:
        self._node = node
        self._on_exit = on_exit
        self._environment = environment
        self._live: dict[str, SimulatedAttempt] = {}
        self._closed = False

    def start(self, spec: LaunchSpec) -> Started:
        if self._closed:
            raise LaunchError(f"cannot start {spec.name!r}: the hollow agent is closed")
        previous = self._live.get(spec.name)
        if previous is not None:
            raise LaunchError(
                f"cannot start {spec.name!r} attempt {spec.attempt}: attempt {previous.attempt}"
                f" (pid {previous.pid}) has not exited yet"
            )
        on_term = spec.env.get(ON_TERM_ENV, "die")
        attempt = SimulatedAttempt(
            spec.name, spec.attempt, next(_PIDS), time.monotonic_ns() // 10_000_000, on_term
        )
        _write_log(spec, self._node, attempt.pid)
        self._live[spec.name] = attempt
        return attempt

    def signal(self, name: str, signum: int) -> None:
        attempt = self._live.get(name)
        if attempt is None or signum == 0 or signum in _IGNORED:
            return
        loop = asyncio.get_running_loop()
        if signum != signal.SIGTERM or attempt.on_term == "die":
            # Later, as a reaped process is seen later: never inside the signal's handling.
            _end_soon(loop, functools.partial(self._end, attempt, _status(signum)))
        elif attempt.on_term != "ignore" and attempt.timer is None:
            seconds = _seconds(attempt.on_term)
            done = ExitStatus(0, None, "exited with code 0")
            attempt.timer = loop.call_later(seconds, self._end, attempt, done)

    def exit(self, name: str, code: int) -> bool:
        """Have `name`'s live attempt exit with `code` (the control FIFO's `exit`)."""
        attempt = self._live.get(name)
        if attempt is None:
            return False
        self._end(attempt, ExitStatus(code, None, f"exited with code {code}"))
        return True

    def get(self, name: str) -> Started | None:
        return self._live.get(name)

    def names(self) -> set[str]:
        return set(self._live)

    def attempts(self) -> Sequence[Started]:
        return list(self._live.values())

    def start_time(self, pid: int) -> int | None:
        for attempt in self._live.values():
            if attempt.pid == pid:
                return attempt.start
        return None

    async def close(self) -> None:
        """SIGKILL every attempt; each exit is reported before this returns."""
        self._closed = True
        for attempt in list(self._live.values()):
            self._end(attempt, _status(signal.SIGKILL))

    def vanish(self) -> None:
        """The node died: its attempts are gone and nobody hears of it."""
        self._closed = True
        for attempt in self._live.values():
            if attempt.timer is not None:
                attempt.timer.cancel()
        self._live.clear()

    def _end(self, attempt: SimulatedAttempt, status: ExitStatus) -> None:
        if self._live.get(attempt.name) is not attempt:
            return  # already ended (a SIGKILL after the SIGTERM that ended it)
        del self._live[attempt.name]
        if attempt.timer is not None:
            attempt.timer.cancel()
        self._on_exit(attempt, status)


def _seconds(text: str) -> float:
    try:
        return max(0.0, float(text))
    except ValueError:
        return 0.0


def _write_log(spec: LaunchSpec, node: str, pid: int) -> None:
    """What a real attempt leaves in its log, in short: the restart marker, then one line."""
    lines = ""
    if spec.attempt > 0:
        lines = restart_marker(
            instance=spec.name, attempt=spec.attempt, node=node, at=datetime.now(UTC)
        )
    lines += f"hollow: {spec.name} attempt {spec.attempt} simulated on {node} (pid {pid})\n"
    try:
        fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LaunchError(f"cannot open log {spec.log_path}: {exc.strerror}") from exc
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)


class SimulatedProbes:
    """Every probe attempt on a simulated instance succeeds (nothing really listens), but
    those of the instances a control line made `unhealthy`."""

    def __init__(self) -> None:
        self.failing: set[str] = set()

    def forget(self, name: str) -> None:
        pass

    async def check(
        self,
        name: str,
        probe: ProbeSpec,
        *,
        node_ip: str,
        attempt: int,
        log_path: Path,
        log_offset: int,
        files_dir: Path,
        env: Mapping[str, str] | None = None,
        liveness: bool = False,
    ) -> tuple[bool, str]:
        if name in self.failing:
            return False, f"simulated {probe.kind.value} probe fails (hollow node, unhealthy)"
        return True, f"simulated {probe.kind.value} probe (hollow node)"


class HollowAgent(Agent):
    """The real agent on simulated processes; it can also die or go silent on request."""

    def __init__(
        self,
        node: str,
        token: str,
        gate: asyncio.Semaphore,
        *,
        adopt_window: float,
        rendezvous: Path | None,
        fingerprint: str | None = None,
        probes: SimulatedProbes | None = None,
    ) -> None:
        self.processes: SimulatedProcesses | None = None
        self._gate = gate
        super().__init__(
            node,
            token,
            inherit_all=False,
            adopt_window=adopt_window,
            rendezvous=rendezvous,
            runner=self._runner,
            probes=probes or SimulatedProbes(),
            fingerprint=fingerprint,
        )

    def _runner(self, node: str, on_exit: ExitReport, environment: EnvironmentOf) -> Runner:
        self.processes = SimulatedProcesses(node, on_exit, environment)
        return self.processes

    async def _join(self, host: str, port: int, within: float) -> Session:
        async with self._gate:
            return await super()._join(host, port, within)

    async def _rejoin(self, deadline: float) -> Session | None:
        # A frozen node stays dead: it does not call the next controller either.
        return None if self.frozen else await super()._rejoin(deadline)

    def _write(self, line: bytes) -> None:
        if not self.frozen:
            super()._write(line)

    @property
    def frozen(self) -> bool:
        """Silent on request: no word, no heartbeat, no call to the next controller."""
        return self._lease.muted

    @frozen.setter
    def frozen(self, value: bool) -> None:
        self._lease.muted = value

    def sever(self) -> None:
        """Drop the connection at once, no goodbye (the caller cancels `run`)."""
        self.frozen = True
        if self._writer is not None:
            self._writer.transport.abort()
        if self.processes is not None:
            self.processes.vanish()


class Hollow:
    """The simulated nodes of one hollow process and their control FIFO. It serves until its
    last agent ended: the first ones, and those a grow request added later (`add NODE`)."""

    def __init__(
        self, nodes: list[str], token: str, args: argparse.Namespace, fingerprint: str = ""
    ) -> None:
        self._token = token
        self._gate = asyncio.Semaphore(JOIN_GATE)
        self._rendezvous = Path(args.rendezvous) if args.rendezvous else None
        self._window = args.adopt_window
        self._fingerprint = fingerprint or None
        self.probes = SimulatedProbes()  # every node's: `unhealthy` names an instance
        self.agents = {node: self._agent(node) for node in nodes}
        self.tasks: dict[str, asyncio.Task[int]] = {}
        self._dial: tuple[str, int] | None = None
        self._running: set[asyncio.Task[int]] = set()
        self._removed: set[asyncio.Task[int]] = set()  # their end is old news, code and all
        self._idle = asyncio.Event()
        self._stopping = False
        self._codes: list[int] = []

    def _agent(self, node: str) -> HollowAgent:
        return HollowAgent(
            node,
            self._token,
            self._gate,
            adopt_window=self._window,
            rendezvous=self._rendezvous,
            fingerprint=self._fingerprint,
            probes=self.probes,
        )

    async def run(self, host: str, port: int) -> int:
        self._dial = (host, port)
        for node in list(self.agents):
            self._start(node)
        if self._running:
            await self._idle.wait()
        return next((c for c in self._codes if c != 0), 0)

    def _start(self, node: str) -> None:
        assert self._dial is not None
        task = asyncio.create_task(self.agents[node].run(*self._dial))
        self.tasks[node] = task
        self._running.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[int]) -> None:
        self._running.discard(task)
        if task.cancelled():
            pass
        elif (exc := task.exception()) is not None:
            log.error("hollow: an agent failed", exc_info=exc)
        elif task not in self._removed:
            self._codes.append(task.result())
        self._removed.discard(task)
        if not self._running:
            self._idle.set()

    def stop(self) -> None:
        self._stopping = True
        for task in self._running:
            task.cancel()

    def command(self, line: str) -> str:
        """One control line; what it did, for the log."""
        words = line.split()
        if len(words) == 2 and words[0] in ("kill", "freeze") and words[1] in self.agents:
            agent = self.agents[words[1]]
            if words[0] == "freeze":
                agent.frozen = True
                return f"froze {words[1]}"
            agent.sever()
            self.tasks[words[1]].cancel()
            return f"killed {words[1]}"
        if len(words) == 2 and words[0] == "add":
            return self._add(words[1])
        if len(words) == 2 and words[0] == "remove":
            return self._remove(words[1])
        if len(words) == 2 and words[0] == "unhealthy":
            self.probes.failing.add(words[1])
            return f"{words[1]}'s probes fail"
        if len(words) == 2 and words[0] == "healthy":
            self.probes.failing.discard(words[1])
            return f"{words[1]}'s probes pass"
        if len(words) == 3 and words[0] == "exit" and words[2].lstrip("-").isdigit():
            for agent in self.agents.values():
                if agent.processes is not None and agent.processes.exit(words[1], int(words[2])):
                    return f"{words[1]} exited with code {words[2]}"
            return f"no live instance {words[1]!r}"
        return f"not a command: {line!r}"

    def _add(self, node: str) -> str:
        """A node a grow request brought: its agent dials the controller as the others did."""
        if self._stopping or self._dial is None or self._idle.is_set():
            return f"not adding {node}: the hollow agents are stopping"
        if node in self.agents:
            return f"not adding {node}: it has an agent already"
        self.agents[node] = self._agent(node)
        self._start(node)
        return f"added {node}"

    def _remove(self, node: str) -> str:
        """A node that went back to its provider: the controller told its agent Shutdown
        already; ending the agent here covers one that never joined or has not read it."""
        agent = self.agents.pop(node, None)
        if agent is None:
            return f"not removing {node}: no such node"
        task = self.tasks.pop(node)
        if not task.done():
            self._removed.add(task)
            task.cancel()
        return f"removed {node}"


def _open_control(path: Path, hollow: Hollow) -> int:
    """Read control lines from FIFO `path` (made here, owner only) as they come."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mkfifo(path, 0o600)
    # Read-write, so that the FIFO never reads as closed between two writers.
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    pending = bytearray()

    def readable() -> None:
        with contextlib.suppress(BlockingIOError):
            pending.extend(os.read(fd, 65536))
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            log.warning("hollow: %s", hollow.command(line.decode(errors="replace")))

    asyncio.get_running_loop().add_reader(fd, readable)
    return fd


async def _main(args: argparse.Namespace, token: str, fingerprint: str = "") -> int:
    nodes = [n for n in args.nodes.split(",") if n]
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ  # this process's agents only
    relay.deliver_in_process()  # a member's relay here gets its datagram without the network
    hollow = Hollow(nodes, token, args, fingerprint)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, hollow.stop)
    control = _open_control(Path(args.control), hollow) if args.control else None
    host, _, port = args.controller.rpartition(":")
    log.info("hollow: %d simulated nodes, controller %s", len(nodes), args.controller)
    try:
        return await hollow.run(host.strip("[]"), int(port))
    finally:
        if control is not None:
            loop.remove_reader(control)
            os.close(control)
            with contextlib.suppress(OSError):
                os.unlink(args.control)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srtr.backends.agent.hollow")
    parser.add_argument("--controller", required=True, metavar="HOST:PORT")
    parser.add_argument("--nodes", required=True, help="the simulated nodes, comma-separated")
    parser.add_argument("--control", metavar="FIFO", help="read control commands here")
    parser.add_argument("--log-dir", metavar="DIR", help="log to DIR/hollow.log")
    parser.add_argument("--adopt-window", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--rendezvous", metavar="FILE")
    args = parser.parse_args(argv)
    handler: logging.Handler = (
        logging.FileHandler(Path(args.log_dir) / "hollow.log")
        if args.log_dir
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    # Two lines per node at INFO: a thousand nodes' worth is still a small log.
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    token = os.environ.pop(p.TOKEN_ENV, "")
    fingerprint = os.environ.pop(tls.FINGERPRINT_ENV, "")
    if not token:
        log.error("hollow: %s is not set", p.TOKEN_ENV)
        return 2
    return asyncio.run(_main(args, token, fingerprint))


def _exit(code: int) -> NoReturn:
    """Exit without the interpreter's teardown: freeing the simulated nodes' objects one by
    one (a GB at 10,000 nodes) took about a second after the last agent had ended, and a
    job's teardown waits for this process to be gone. Every agent ended and every log line
    is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
