"""The node agent: owns the instances of one node for the controller that started it.

    SRTR_AGENT_TOKEN=... SRTR_AGENT_FINGERPRINT=sha256:... \\
        python -m srtr.backends.agent.node --controller HOST:PORT \\
        (--node NAME | --node-env VAR) [--inherit minimal|all] [--log-dir DIR]

It connects to the controller, proves it holds the job's token (`protocol`), and then does
what the controller asks: starts instance attempts as process groups (`procgroup`, the local
backend's code: same logs, restart markers, pidfd watching), signals them, runs their
readiness probes here on the node (`prober.ProbeRunner`), and reports every exit. It sends a
heartbeat every period the controller chose, so the controller sees a silent node within
seconds.

The heartbeats are empty lines on the same connection (`protocol.BEAT`): the controller
holds one descriptor per agent (`channel`, "Heartbeats").

The lease: the agent fences itself when cut off from its controller, so that no instance
runs twice (`lease.py`; docs/agents.md, "The lease").

It never outlives its job for long. On SIGTERM or on `Shutdown` it SIGKILLs every instance
it started, waits for them to be reaped, and exits. When the connection ends otherwise (the
controller died, or the network did) it keeps its instances for `--adopt-window` seconds,
reading the `--rendezvous` file for the address of a controller that adopts the job
(`srtr up --adopt`), and joins it with the same token, listing what still runs; if none
comes in time, it stops everything as above. Its instances' leaders also die with it if
it is killed outright (the parent-death signal, `die_with_parent`).

The connection is TLS 1.3 when `SRTR_AGENT_FINGERPRINT` is set (`srtr up` always sets it):
the agent pins the job's certificate by that SHA-256 fingerprint (`srtr.net.tls`, stdlib `ssl`
and `hashlib` only) and hangs up on any other before it sends a byte of its own; then the
token's proofs run inside the encrypted channel as before.

The token and the fingerprint come from the environment and are removed from it at once,
so no instance inherits them. `--inherit all` (SLURM: the agent step's environment is the
controller's, handed over by `--export=ALL`) passes the agent's environment on to
instances, as a step would; `minimal` passes the same few variables as the local backend
(`node_env.py`). How the agent dials its controller is `dial.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from srtr.backends.agent import protocol as p
from srtr.backends.agent.dial import HANDSHAKE_TIMEOUT, Wire, connect, read_rendezvous
from srtr.backends.agent.lease import Lease
from srtr.backends.agent.node_env import inherited_env
from srtr.backends.agent.node_watch import Probes, Watches
from srtr.backends.agent.relay import Role
from srtr.backends.base import LaunchError, LaunchSpec
from srtr.backends.prober import ProbeRunner
from srtr.backends.procgroup import (
    ExitStatus,
    ProcessGroups,
    instance_command,
    instance_environment,
    process_start_time,
)
from srtr.net import tls

log = logging.getLogger("srtr.agent")

CONNECT_TIMEOUT = 60.0
REJOIN_PERIOD = 0.2  # how often an agent without a controller reads the rendezvous file
EXIT_AUTH = 3
EXIT_CONNECT = 4


# The TLS connection (reader, writer), the heartbeat period.
Session = tuple[asyncio.StreamReader, asyncio.StreamWriter, float]


class Started(Protocol):
    """One live attempt as the agent sees it (`procgroup.Attempt`, or a simulated one)."""

    @property
    def name(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def pid(self) -> int: ...


ExitReport = Callable[[Started, ExitStatus | None], None]
EnvironmentOf = Callable[[LaunchSpec], dict[str, str]]


class Runner(Protocol):
    """What runs a node's instance attempts: `ProcessGroups` (real processes), or hollow
    mode's simulated ones (`hollow.SimulatedProcesses`). The agent's protocol handling is the
    same for both, so a hollow run exercises the real agent and controller code."""

    def start(self, spec: LaunchSpec) -> Started: ...
    def signal(self, name: str, signum: int) -> None: ...
    def get(self, name: str) -> Started | None: ...
    def names(self) -> set[str]: ...
    def attempts(self) -> Sequence[Started]: ...
    def start_time(self, pid: int) -> int | None: ...
    async def close(self) -> None: ...


# Builds a node's runner from the agent's exit report and environment builder.
RunnerFactory = Callable[[str, ExitReport, EnvironmentOf], Runner]


class _Processes(ProcessGroups):
    """Real process groups, their leaders dying with the agent."""

    def start_time(self, pid: int) -> int | None:
        return process_start_time(pid)


def real_processes(node: str, on_exit: ExitReport, environment: EnvironmentOf) -> Runner:
    return _Processes(
        on_exit,
        command=instance_command,
        environment=environment,
        owner=f"agent on {node}",
        die_with_parent=True,
    )


class HandshakeError(Exception):
    """The peer is not our controller (bad proof) or does not speak the protocol."""


class Agent:
    """One node's agent: a connection to the controller and the node's process groups."""

    def __init__(
        self,
        node: str,
        token: str,
        *,
        inherit_all: bool,
        adopt_window: float = 0.0,
        rendezvous: Path | None = None,
        runner: RunnerFactory = real_processes,
        probes: Probes | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """`fingerprint`: speak TLS and pin the controller's certificate to it; None: the
        clear (tests of the protocol alone)."""
        self.node = node
        self._token = token
        self._fingerprint = fingerprint
        self._window = adopt_window if rendezvous is not None else 0.0
        self._rendezvous = rendezvous
        self._inherited = inherited_env(inherit_all, node)
        self._groups = runner(node, self._exited, self._environment)
        self._probes: Probes = probes if probes is not None else ProbeRunner()
        self._watches = Watches(node, self._probes, self._send)  # probe loops (`node_watch`)
        self._writer: asyncio.StreamWriter | None = None
        self._wire: Wire | None = None  # rings the controller's doorbell after each write
        self._outbox: list[bytes] = []  # lines sent in this turn of the loop (`_send`)
        self._tasks: set[asyncio.Task[None]] = set()
        self._lease = Lease(node, self._groups, self._window)
        self._relay = Role(node, self._send, self._post)  # its part in a relay group
        self._lease.on_beat = self._relay.beat

    async def run(self, host: str, port: int) -> int:
        """Serve the controller at host:port, and the ones that adopt the job after it, until
        one says Shutdown or none comes back within the adopt window; 0 when done."""
        session: Session | None
        try:
            session = await self._join(host, port, CONNECT_TIMEOUT)
        except (HandshakeError, p.ProtocolError, TimeoutError) as exc:  # before OSError
            log.error("agent %s: handshake with %s:%d failed: %s", self.node, host, port, exc)
            return EXIT_AUTH
        except OSError as exc:
            log.error("agent %s: cannot reach %s:%d: %s", self.node, host, port, exc)
            return EXIT_CONNECT
        why = ""
        try:
            while session is not None:
                why, orderly = await self._session(*session)
                if orderly or self._window <= 0 or self._lease.gave_up:
                    break
                log.warning(
                    "agent %s: %s; keeping %d instance(s) for a new controller, up to %gs",
                    self.node,
                    why,
                    len(self._groups.names()),
                    self._window,
                )
                session = await self._rejoin(time.monotonic() + self._window)
                if session is None:
                    why = f"{why}; no controller adopted the job within {self._window:g}s"
        except asyncio.CancelledError:
            why = "stopped by a signal"
        finally:
            await self._stop()
        log.info("agent %s: %s; every instance is gone", self.node, why)
        return 0

    async def _join(self, host: str, port: int, within: float) -> Session:
        """Connect to host:port and prove who we are; the session to serve."""
        reader, writer = await connect(host, port, within, tls=self._fingerprint is not None)
        self._writer = writer
        self._outbox = []  # what the last session did not write yet goes nowhere now
        self._wire = None  # until the Welcome gives the session's key
        self._relay.reset()  # the last controller's relay groups are no more
        try:
            if self._fingerprint is not None:
                try:
                    tls.check_ssl_object(writer.get_extra_info("ssl_object"), self._fingerprint)
                except tls.PinError as exc:
                    raise HandshakeError(f"not our controller: {exc}") from None
            welcome = await asyncio.wait_for(self._handshake(reader), HANDSHAKE_TIMEOUT)
        except BaseException:
            writer.close()
            raise
        self._lease.beats = writer
        self._wire = self._lease.wire = Wire(writer, welcome.beat_key)
        self._relay.period = welcome.heartbeat
        log.info("agent %s: serving the controller at %s:%d", self.node, host, port)
        return reader, writer, welcome.heartbeat

    async def _session(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        heartbeat: float,
    ) -> tuple[str, bool]:
        """Serve one controller; (why it ended, whether it told us to stop)."""
        beating = asyncio.create_task(self._lease.beat(heartbeat))
        serving = asyncio.create_task(self._serve(reader))
        try:
            await asyncio.wait((beating, serving), return_when=asyncio.FIRST_COMPLETED)
            if serving.done():
                return serving.result()
            return beating.result(), False  # the lease and the adopt window ran out
        finally:
            beating.cancel()
            serving.cancel()
            writer.close()

    async def _rejoin(self, deadline: float) -> Session | None:
        """Join whichever controller the rendezvous file names, until `deadline`."""
        assert self._rendezvous is not None
        while time.monotonic() < deadline:
            address = read_rendezvous(self._rendezvous)
            if address is not None:
                try:
                    return await self._join(*address, within=0)
                except (OSError, HandshakeError, p.ProtocolError, TimeoutError):
                    pass  # the dead controller's address, or not ours: look again
            await asyncio.sleep(REJOIN_PERIOD)
        return None

    async def _handshake(self, reader: asyncio.StreamReader) -> p.Welcome:
        challenge = p.decode(await reader.readline())
        if not isinstance(challenge, p.Challenge) or challenge.version != p.VERSION:
            raise HandshakeError(f"expected a challenge of version {p.VERSION}, got {challenge}")
        nonce = secrets.token_hex(16)
        proof = p.proof(self._token, "agent", challenge.nonce, self.node)
        live = [
            [a.name, a.attempt, a.pid, self._groups.start_time(a.pid)]
            for a in self._groups.attempts()
        ]
        hello = p.Hello(node=self.node, pid=os.getpid(), nonce=nonce, proof=proof, live=live)
        hello_sent = time.monotonic()  # the controller hears this before it welcomes us
        self._send(hello)
        line = await reader.readline()
        if not line:
            raise HandshakeError("the controller refused us (a wrong token?) and hung up")
        welcome = p.decode(line)
        if not isinstance(welcome, p.Welcome):
            raise HandshakeError(f"refused: {welcome}")
        if not p.verify(self._token, "controller", nonce, self.node, welcome.proof):
            raise HandshakeError("the controller's proof is wrong: not our controller")
        self._lease.granted(welcome.lease, hello_sent)
        return welcome

    async def _serve(self, reader: asyncio.StreamReader) -> tuple[str, bool]:
        """Handle messages until the connection ends or a Shutdown; (why it ended, whether
        the controller told us to stop)."""
        while True:
            try:
                line = await reader.readline()
            except (OSError, ValueError) as exc:  # ValueError: a line over the limit
                return f"connection lost: {exc}", False
            if not line:
                return "the controller closed the connection", False
            try:
                message = p.decode(line)
            except p.ProtocolError as exc:
                return f"dropped the connection: {exc}", False
            if isinstance(message, p.Shutdown):
                await self._stop()
                self._send(p.Bye())
                await self._drain()
                why = message.reason or "no reason given"
                return f"shut down by the controller ({why})", True
            self._handle(message)
            if self._writer is not None:
                await self._writer.drain()

    def _handle(self, message: p.Message) -> None:
        if isinstance(message, p.Launch):
            self._launch(message.seq, message.spec)
        elif isinstance(message, p.Signal):
            live = self._groups.get(message.name)
            if live is not None and message.attempt in (None, live.attempt):
                self._groups.signal(message.name, message.signum)
        elif isinstance(message, p.Watch):
            self._watches.watch(message)
        elif isinstance(message, p.Relay | p.RelayTo):
            host = self._writer.get_extra_info("sockname")[0] if self._writer else ""
            self._relay.handle(message, str(host))
        elif isinstance(message, p.Probe):
            task = asyncio.create_task(self._probe(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            log.warning("agent %s: ignoring unexpected %s", self.node, type(message).__name__)

    def _launch(self, seq: int, spec: LaunchSpec) -> None:
        if self._lease.fenced is not None:  # a launch TCP delivered late, after the lease ran out
            why = f"the agent of {self.node} fenced itself: {self._lease.fenced}"
            self._send(p.LaunchFailed(seq, spec.name, spec.attempt, why))
            return
        self._probes.forget(spec.name)
        self._watches.forget(spec.name)
        self._lease.graces[spec.name] = spec.stop_grace_seconds
        try:
            attempt = self._groups.start(spec)
        except LaunchError as exc:
            self._send(p.LaunchFailed(seq, spec.name, spec.attempt, str(exc)))
            return
        start = self._groups.start_time(attempt.pid)
        self._send(p.Launched(seq, spec.name, spec.attempt, attempt.pid, start))

    async def _probe(self, request: p.Probe) -> None:
        try:
            ok, message = await self._probes.check(
                request.name,
                request.probe,
                node_ip=request.node_ip,
                attempt=request.attempt,
                log_path=Path(request.log_path),
                log_offset=request.log_offset,
                files_dir=Path(request.files_dir),
                env=request.env,
                liveness=request.liveness,
            )
        except Exception as exc:  # a probe bug is a failed probe, not a dead agent
            ok, message = False, f"probe error on {self.node}: {exc!r}"
        self._send(p.ProbeResult(request.seq, ok, message))

    def _exited(self, attempt: Started, status: ExitStatus | None) -> None:
        code = None if status is None else status.code
        signum = None if status is None else status.signal
        message = "exit status unknown" if status is None else status.message
        self._watches.forget(attempt.name)
        if self._lease.fenced is not None:
            message = f"{message} (fenced: {self._lease.fenced})"
            log.warning(
                "agent %s: fenced %s (attempt %d): %s",
                self.node,
                attempt.name,
                attempt.attempt,
                message,
            )
        reason = "" if status is None else status.reason
        self._send(
            p.Exited(attempt.name, attempt.attempt, attempt.pid, code, signum, message, reason)
        )

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        return instance_environment(spec, self._inherited)

    async def _stop(self) -> None:
        self._watches.close()
        self._relay.reset()
        for task in list(self._tasks):
            task.cancel()
        await self._groups.close()

    async def _drain(self) -> None:
        self._flush()
        if self._writer is not None:
            with contextlib.suppress(OSError):
                await self._writer.drain()

    def _send(self, message: p.Message) -> None:
        """Queue `message`: what one turn of the loop sends (a node's launch answers, a
        teardown's exits) leaves as one write, so one TLS record and one doorbell."""
        self._outbox.append(p.encode(message))
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write what `_send` queued."""
        lines, self._outbox = self._outbox, []
        if lines:
            self._write(lines[0] if len(lines) == 1 else b"".join(lines))

    def _post(self, message: p.Message) -> None:
        """Write `message` at once and ring no doorbell: the controller's watcher reads it at
        its next look (a relay's record, once a second, must not wake the controller's loop)."""
        writer = self._writer
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError):
                writer.write(p.encode(message))

    def _write(self, line: bytes) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        with contextlib.suppress(OSError):
            writer.write(line)
            if self._wire is not None:
                self._wire.ring()


async def _main(args: argparse.Namespace, node: str, token: str, fingerprint: str) -> int:
    if not node:
        log.error("agent: no node name (--node, or --node-env %s is unset)", args.node_env)
        return 2
    agent = Agent(
        node,
        token,
        inherit_all=args.inherit == "all",
        adopt_window=args.adopt_window,
        rendezvous=Path(args.rendezvous) if args.rendezvous else None,
        fingerprint=fingerprint or None,
    )
    host, _, port = args.controller.rpartition(":")
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, task.cancel)
    try:
        return await agent.run(host.strip("[]"), int(port))
    except asyncio.CancelledError:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srtr.backends.agent.node")
    parser.add_argument("--controller", required=True, metavar="HOST:PORT")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", help="this node's name")
    where.add_argument("--node-env", metavar="VAR", help="read the node's name from $VAR")
    parser.add_argument("--inherit", choices=("minimal", "all"), default="minimal")
    parser.add_argument(
        "--log-dir", metavar="DIR", help="log to DIR/agent-NODE.log (default: stderr)"
    )
    parser.add_argument(
        "--adopt-window",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when the controller goes, keep the instances this long for a new one (0: stop)",
    )
    parser.add_argument(
        "--rendezvous", metavar="FILE", help="where a new controller writes its HOST:PORT"
    )
    args = parser.parse_args(argv)
    node = args.node or os.environ.get(args.node_env or "", "")
    handler: logging.Handler = (
        logging.FileHandler(Path(args.log_dir) / f"agent-{node or 'unknown'}.log")
        if args.log_dir
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    token = os.environ.pop(p.TOKEN_ENV, "")
    fingerprint = os.environ.pop(tls.FINGERPRINT_ENV, "")
    if not token:
        log.error("agent: %s is not set", p.TOKEN_ENV)
        return 2
    return asyncio.run(_main(args, node, token, fingerprint))


if __name__ == "__main__":
    sys.exit(main())
