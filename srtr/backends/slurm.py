"""The SLURM backend: every instance attempt is one srun step inside the job's allocation.

The srun client of each step is a local child process, so starting, reaping and log handling
are a `procgroup.ProcessGroups`'s, as in the local backend; what differs is the command line
(srun, see `slurm_cmd.srun_argv`), how a step is signalled (`scancel --signal --full JOB.STEP`,
so the signal reaches the task and not the srun client, which would abort the step), and how
lost steps and DOWN nodes are noticed: one poller runs `squeue --steps -j JOB` and
`scontrol show node` for the whole job once per period, never one call per instance.

Allocation handling lives here too: discovery inside an allocation (`SLURM_JOB_ID`,
`SLURM_JOB_NODELIST`, NodeAddr from scontrol) and `salloc --no-shell` from outside, with the
allocation released whatever way the job ends.

Every call to a SLURM command goes through `SlurmCommands.run`, which retries transient
failures ("Socket timed out", "Unable to contact slurm controller") with tenacity, with a
bounded exponential backoff, and logs each retry; a command that still fails is reported,
never raised into the controller loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tenacity

from srtr.backends import slurm_cmd
from srtr.backends.base import (
    Capabilities,
    Identity,
    LaunchError,
    LaunchSpec,
    Listener,
    NodeInfo,
    Observation,
    ObservationKind,
)
from srtr.backends.pdeathsig import dies_with_us
from srtr.backends.procgroup import Attempt, ExitStatus, ProcessGroups, exited, kill_group

log = logging.getLogger("srtr")

TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "connection refused",
    "slurm_receive_msg",
    "resource temporarily unavailable",
    "try again",
    "send/recv operation timed out",
)
POLL_PERIOD = 2.0
STEP_GONE_TIMEOUT = 15.0


class SlurmError(Exception):
    """A SLURM command failed for good; the message carries its stderr."""


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: list[NodeInfo]
    owned: bool  # srtr asked for it (salloc) and must release it


class SlurmCommands:
    """Runs SLURM client commands with retries on transient failures."""

    def __init__(self, *, attempts: int = 5, max_wait: float = 8.0, timeout: float = 30.0) -> None:
        self.attempts = attempts
        self.max_wait = max_wait
        self.timeout = timeout

    def run(
        self, argv: Sequence[str], *, check: bool = True, retry: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv`; retry transient failures; raise SlurmError on a final failure.

        `retry=False` is for a command that is not idempotent (sbatch): after a timeout it
        may have taken effect, so it runs once and a transient failure is final.
        """
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts if retry else 1),
            wait=tenacity.wait_exponential(multiplier=0.25, max=self.max_wait),
            retry=tenacity.retry_if_exception_type(_Transient),
            before_sleep=lambda state: log.warning(
                "slurm: %s failed (attempt %d): %s; retrying",
                argv[0],
                state.attempt_number,
                state.outcome.exception() if state.outcome else "",
            ),
            reraise=True,
        )
        try:
            return retrying(self._once, list(argv), check)
        except _Transient as exc:
            if not retry:
                raise SlurmError(f"{argv[0]} failed: {exc}") from None
            raise SlurmError(f"{argv[0]} kept failing: {exc}") from None

    def _once(self, argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _Transient(f"{argv[0]} timed out after {self.timeout:g}s") from None
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found: is SLURM installed?") from None
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip()
            if any(marker in text.lower() for marker in TRANSIENT):
                raise _Transient(text)
            if check:
                raise SlurmError(f"{' '.join(argv[:3])} failed ({done.returncode}): {text}")
        return done

    async def arun(
        self, argv: Sequence[str], *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        # A thread, not asyncio subprocesses: asyncio's child watcher on 3.11 starts a thread
        # per child anyway, and this keeps one code path for the sync callers.
        return await asyncio.to_thread(self.run, argv, check=check)


# --- allocation ------------------------------------------------------------------------------


def in_allocation() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def node_infos(commands: SlurmCommands, names: list[str]) -> list[NodeInfo]:
    """NodeInfo in allocation order, IPs from each node's NodeAddr."""
    done = commands.run(slurm_cmd.scontrol_show_node_argv(names))
    rows = slurm_cmd.parse_scontrol_nodes(done.stdout)
    missing = [n for n in names if n not in rows]
    if missing:
        raise SlurmError(f"scontrol does not know node(s) {', '.join(missing)}")
    return [NodeInfo(name=n, ip=rows[n].addr or n) for n in names]


def discover(commands: SlurmCommands) -> Allocation:
    """The allocation this process runs in (SLURM_JOB_ID and SLURM_JOB_NODELIST)."""
    job_id = os.environ["SLURM_JOB_ID"]
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise SlurmError("SLURM_JOB_NODELIST not set - are we running in SLURM?")
    done = commands.run(slurm_cmd.scontrol_show_hostnames_argv(nodelist))
    names = slurm_cmd.parse_hostnames(done.stdout)
    return Allocation(job_id=job_id, nodes=node_infos(commands, names), owned=False)


def allocate(
    commands: SlurmCommands,
    *,
    nodes: int,
    job_name: str,
    partition: str | None,
    account: str | None,
    time_limit: str | None,
    output: int | None = None,
) -> Allocation:
    """`salloc --no-shell`: blocks until granted; returns the allocation srtr now owns.

    salloc's stderr, which names the job (`Pending job allocation N` while it waits,
    `Granted job allocation N`), goes to `output` when given: a memfd the job's guard holds
    too, started before salloc, so the guard knows the job whenever srtr dies (see
    `runtime.guard`). The kernel writes it; no srtr code has to run in between.
    """
    argv = slurm_cmd.salloc_argv(
        nodes=nodes, job_name=job_name, partition=partition, account=account, time_limit=time_limit
    )
    fd = output if output is not None else os.memfd_create("srtr-salloc", os.MFD_CLOEXEC)
    try:
        proc = subprocess.Popen(
            dies_with_us(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fd
        )
        try:
            proc.wait()
        except BaseException:
            # Ctrl+C while the job is pending: cancel what salloc may have asked for.
            proc.kill()
            proc.wait()
            pending = salloc_job_id(read_output(fd))
            if pending is not None:
                release(commands, pending)
            raise
        stderr = read_output(fd)
    finally:
        if output is None:
            os.close(fd)
    job_id = slurm_cmd.parse_salloc_job_id(stderr)
    if proc.returncode != 0 or job_id is None:
        raise SlurmError(f"salloc failed ({proc.returncode}): {stderr.strip()}")
    try:
        done = commands.run(slurm_cmd.squeue_nodes_argv(job_id))
        hostlist = slurm_cmd.parse_squeue_nodes(done.stdout)
        names = slurm_cmd.parse_hostnames(
            commands.run(slurm_cmd.scontrol_show_hostnames_argv(hostlist)).stdout
        )
        return Allocation(job_id=job_id, nodes=node_infos(commands, names), owned=True)
    except BaseException:
        release(commands, job_id)
        raise


def read_output(fd: int) -> str:
    """Everything written to the memfd `fd` so far."""
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def salloc_job_id(stderr: str) -> str | None:
    """The job salloc asked for, granted or still pending, from what it printed."""
    return slurm_cmd.parse_salloc_job_id(stderr) or slurm_cmd.parse_salloc_pending_job_id(stderr)


def release(commands: SlurmCommands, job_id: str) -> None:
    with contextlib.suppress(SlurmError):
        commands.run(slurm_cmd.scancel_job_argv(job_id), check=False)


def pyxis_available(commands: SlurmCommands) -> bool:
    try:
        done = commands.run(slurm_cmd.srun_help_argv(), check=False)
    except SlurmError:
        return False
    return slurm_cmd.parse_pyxis(done.stdout)


# --- the backend -----------------------------------------------------------------------------


class SlurmBackend:
    """Runs each instance attempt as an srun step in allocation `job_id`."""

    name = "slurm"

    def __init__(
        self,
        allocation: Allocation,
        *,
        commands: SlurmCommands | None = None,
        pyxis: bool = False,
        poll_period: float = POLL_PERIOD,
    ) -> None:
        self._nodes = list(allocation.nodes)
        self._listener: Listener | None = None
        self._groups = ProcessGroups(
            self._exited, command=self._command, environment=self._environment, owner=self.name
        )
        self.allocation = allocation
        self.job_id = allocation.job_id
        self.commands = commands or SlurmCommands()
        self.capabilities = Capabilities(containers=pyxis, walltime=True)
        self.poll_period = poll_period
        self._steps: dict[str, str] = {}  # instance name → step id of its live attempt
        self._seen: set[str] = set()  # names whose step squeue has shown
        self._missing: dict[str, int] = {}  # name → polls its step was not listed
        self._lost: set[tuple[str, int]] = set()  # (name, attempt) reported Lost
        self._down: dict[str, str] = {}  # node → state, while down
        self._node: dict[str, str] = {}  # instance name → node of its live attempt
        self._log: dict[str, tuple[Path, int]] = {}  # name → (log, size when it started)
        self._poller: asyncio.Task[None] | None = None

    @property
    def owns_allocation(self) -> bool:
        return self.allocation.owned

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    def running(self) -> set[str]:
        return self._groups.names()

    def identity(self, name: str) -> Identity | None:
        """pid and kernel start time of the step's srun client: what adoption checks later."""
        return self._groups.identity(name)

    def lose_node(self, node: str) -> list[str]:
        """SLURM nodes are real: they fail by themselves, never on request."""
        raise ValueError(f"the {self.name} backend has no simulated nodes to lose")

    # -- launching ------------------------------------------------------------------------

    def _command(self, spec: LaunchSpec) -> list[str]:
        try:
            return slurm_cmd.srun_argv(
                job_id=self.job_id,
                node=spec.node,
                step_name=spec.name,
                log_path=spec.log_path,
                env=_instance_env(spec),
                argv=spec.argv,
                preamble=spec.preamble,
                shell=spec.shell,
                container=spec.container,
                pyxis=self.capabilities.containers,
                cpus_per_task=spec.cpus_per_task,
                cpu_bind=spec.cpu_bind,
                srun_options=dict(spec.srun_options),
                cwd=spec.cwd,
            )
        except ValueError as exc:
            raise LaunchError(f"cannot start {spec.name!r} as an srun step: {exc}") from None

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        # The instance's environment rides in the srun client's own (only its owner can read
        # it, unlike argv); srun needs SLURM_CONF and PATH from ours. _command validated it.
        return slurm_cmd.srun_client_env(os.environ, _instance_env(spec))

    async def launch(self, spec: LaunchSpec) -> int:
        if spec.node in self._down:
            raise LaunchError(
                f"cannot start {spec.name!r}: node {spec.node} is {self._down[spec.node]}"
            )
        try:
            start = spec.log_path.stat().st_size
        except OSError:
            start = 0
        pid = self._groups.start(spec).pid
        self._node[spec.name] = spec.node
        self._log[spec.name] = (spec.log_path, start)
        self._steps.pop(spec.name, None)
        self._seen.discard(spec.name)
        self._missing.pop(spec.name, None)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_forever())
        return pid

    async def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """Adopt a step a crashed controller started: its srun client by pid and start time,
        the step itself by its name in `squeue --steps` (which also gives its node)."""
        if not self._groups.adopt(name, attempt, identity):
            return False
        await self._poll_once()
        if name not in self._steps:
            log.warning("slurm: %s: srun client alive but no step named so", name)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_forever())
        return True

    # -- signalling -----------------------------------------------------------------------

    async def signal(self, name: str, signum: int) -> None:
        if name not in self._groups:
            return
        step = self._steps.get(name)
        for _ in range(10):  # a step shows in squeue some ms after its srun starts
            if step is not None or name not in self._groups:
                break
            step = await self._find_step(name)
            if step is None:
                await asyncio.sleep(0.1)
        if name not in self._groups:
            return
        if step is None:
            # Never registered with slurmctld: the srun client is all there is to stop. Any
            # signal to it ends the task at once with SIGKILL (measured: docs/slurm-facts.md),
            # so this stop is not graceful.
            log.warning("slurm: %s has no step id; stopping its srun client", name)
            self._groups.signal(name, signum)
            return
        argv = slurm_cmd.scancel_step_argv(self.job_id, step, signum)
        try:
            await self.commands.arun(argv, check=False)
        except SlurmError as exc:
            log.warning("slurm: cannot signal %s (step %s): %s", name, step, exc)
            self._groups.signal(name, signum)

    async def _find_step(self, name: str) -> str | None:
        await self._poll_once()
        return self._steps.get(name)

    # -- observing ------------------------------------------------------------------------

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._listener is None:
            return
        if status is None:
            # An adopted srun client is not our child, so its status is unknown. Its step and
            # a loss noted by _lose are not looked up (they never were): an adopted step whose
            # node died reads as an exit of unknown status, not as LOST.
            self._listener(exited(attempt, None))
            return
        self._listener(self._exit_observation(attempt, status))

    def _exit_observation(self, attempt: Attempt, status: ExitStatus) -> Observation:
        """What a reaped srun client means: LOST with its node, else the step's exit."""
        step = self._steps.pop(attempt.name, None)
        if (attempt.name, attempt.attempt) in self._lost:
            self._lost.discard((attempt.name, attempt.attempt))
            return Observation(
                kind=ObservationKind.LOST,
                name=attempt.name,
                attempt=attempt.attempt,
                pid=attempt.pid,
                step=step,
                message="its node was lost",
            )
        failed_node = _node_failure_in_log(*self._log.get(attempt.name, (None, 0)))
        if failed_node is not None:
            return Observation(
                kind=ObservationKind.LOST,
                name=attempt.name,
                attempt=attempt.attempt,
                pid=attempt.pid,
                step=step,
                message=f"node failure on {failed_node}",
            )
        return dataclasses.replace(exited(attempt, status), step=step)

    async def _poll_forever(self) -> None:
        while not self._groups.closed:
            try:
                await self._poll_once()
            except Exception:  # the poller must outlive any one bad answer
                log.exception("slurm: poll failed")
            await asyncio.sleep(self.poll_period)

    async def _poll_once(self) -> None:
        steps_done, nodes_done = await asyncio.gather(
            self.commands.arun(slurm_cmd.squeue_steps_argv(self.job_id), check=False),
            self.commands.arun(
                slurm_cmd.scontrol_show_node_argv([n.name for n in self._nodes]), check=False
            ),
        )
        self._note_steps(
            slurm_cmd.parse_squeue_steps(steps_done.stdout) if steps_done.returncode == 0 else None
        )
        if nodes_done.returncode == 0:
            self._note_nodes(slurm_cmd.parse_scontrol_nodes(nodes_done.stdout))

    def _note_steps(self, rows: list[slurm_cmd.StepRow] | None) -> None:
        if rows is None:
            return
        listed = {r.name: r.step_id for r in rows if r.name in self._groups}
        for row in rows:
            if row.name in self._groups and row.name not in self._node and "[" not in row.nodes:
                self._node[row.name] = row.nodes  # adopted steps learn their node here
        for name, step in listed.items():
            if self._steps.get(name) != step:
                self._steps[name] = step
                self._report(ObservationKind.STARTED, name, step=step)
            self._seen.add(name)
            self._missing.pop(name, None)
        # A step squeue showed before and no longer shows while its srun client still
        # runs is lost (slurmctld dropped it); two polls in a row rule out a race with exit.
        for name in [n for n in self._groups.names() if n in self._seen and n not in listed]:
            self._missing[name] = self._missing.get(name, 0) + 1
            if self._missing[name] >= 2:
                self._lose(name, "its step vanished from squeue")

    def _note_nodes(self, rows: Mapping[str, slurm_cmd.NodeRow]) -> None:
        for node, row in rows.items():
            if row.down and node not in self._down:
                self._down[node] = row.state
                log.warning("slurm: node %s is %s (%s)", node, row.state, row.reason)
                for attempt in [a for a in self._groups.attempts() if self._node_of(a) == node]:
                    self._lose(attempt.name, f"node {node} is {row.state}")
            elif not row.down and node in self._down:
                del self._down[node]
                log.info("slurm: node %s is back (%s)", node, row.state)

    def _node_of(self, attempt: Attempt) -> str | None:
        return self._node.get(attempt.name)

    def _lose(self, name: str, why: str) -> None:
        attempt = self._groups.get(name)
        if attempt is None or (name, attempt.attempt) in self._lost:
            return
        log.warning("slurm: %s lost: %s", name, why)
        self._lost.add((name, attempt.attempt))
        # The srun client may hang on a dead node for minutes; its exit, reported as LOST by
        # _exit_observation, is what frees the instance.
        kill_group(attempt.pgid)

    def _report(self, kind: ObservationKind, name: str, *, step: str | None = None) -> None:
        attempt = self._groups.get(name)
        if self._listener is not None and attempt is not None:
            self._listener(
                Observation(
                    kind=kind, name=name, attempt=attempt.attempt, pid=attempt.pid, step=step
                )
            )

    async def end_time(self) -> float | None:
        """When the allocation's time limit ends (epoch seconds), or None when unlimited."""
        try:
            done = await self.commands.arun(
                slurm_cmd.squeue_end_time_argv(self.job_id), check=False
            )
        except SlurmError:
            return None
        return slurm_cmd.parse_end_time(done.stdout)

    # -- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """SIGKILL every step, reap the srun clients, wait until squeue lists none of ours,
        and release the allocation when srtr made it."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        steps = [s for n, s in self._steps.items() if n in self._groups]
        if steps:
            argv = slurm_cmd.scancel_steps_argv(self.job_id, steps, "KILL")
            with contextlib.suppress(SlurmError):
                await self.commands.arun(argv, check=False)
        await self._groups.close()
        await self._wait_steps_gone()
        await asyncio.to_thread(self.release_allocation)

    def release_allocation(self) -> None:
        """Give back the allocation if srtr asked for it: `close` does, and so does the CLI
        for a job that ends before it ever ran."""
        if self.allocation.owned:
            release(self.commands, self.job_id)

    async def _wait_steps_gone(self) -> None:
        deadline = time.monotonic() + STEP_GONE_TIMEOUT
        while time.monotonic() < deadline:
            try:
                done = await self.commands.arun(
                    slurm_cmd.squeue_steps_argv(self.job_id), check=False
                )
            except SlurmError:
                return
            ours = [
                r
                for r in slurm_cmd.parse_squeue_steps(done.stdout)
                if r.name.startswith(("service_", "worker_", "frontend", "benchmark"))
            ]
            if done.returncode != 0 or not ours:
                return
            await asyncio.sleep(0.2)
        log.warning("slurm: steps still listed %gs after close", STEP_GONE_TIMEOUT)


def _instance_env(spec: LaunchSpec) -> dict[str, str]:
    return {
        **spec.env,
        "SRTR_NODE": spec.node,
        "SRTR_NODE_IP": spec.node_ip,
        "SRTR_INSTANCE": spec.name,
    }


def _node_failure_in_log(path: Path | None, start: int) -> str | None:
    """srun exits 0 when its step's node fails; its last words in this attempt's log tell."""
    if path is None:
        return None
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(start, size - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return None
    return slurm_cmd.parse_srun_node_failure(tail)
