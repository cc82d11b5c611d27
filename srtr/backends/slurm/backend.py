"""The SLURM backend: every instance attempt is one srun step inside the job's allocation.

The srun client of each step is a local child process, so starting, reaping and log handling
are a `procgroup.ProcessGroups`'s, as in the local backend; what differs is the command line
(srun, see `slurm_cmd.srun_argv`), how a step is signalled (`scancel --signal --full JOB.STEP`,
so the signal reaches the task and not the srun client, which would abort the step), and how
lost steps and DOWN nodes are noticed: one poller runs `squeue --steps -j JOB` and
`scontrol show node` for the whole job once per period, never one call per instance.

Allocations (discovery, salloc, release) and the retrying command runner live in
`slurm_alloc`; they are re-exported here, the backend's one public module.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from srtr.backends.base import (
    Capabilities,
    Identity,
    LaunchError,
    LaunchSpec,
    Listener,
    NodeInfo,
    Observation,
    ObservationKind,
    host_has_program,
)
from srtr.backends.cgroups import OOM_KILLED
from srtr.backends.procgroup import Attempt, ExitStatus, ProcessGroups, exited, kill_group
from srtr.backends.slurm import cmd as slurm_cmd
from srtr.backends.slurm.alloc import (
    Allocation,
    SlurmCommands,
    SlurmError,
    allocate,
    discover,
    in_allocation,
    node_infos,
    pyxis_available,
    read_output,
    release,
    salloc_job_id,
)

__all__ = [
    "Allocation",
    "SlurmBackend",
    "SlurmCommands",
    "SlurmError",
    "allocate",
    "discover",
    "in_allocation",
    "node_infos",
    "pyxis_available",
    "read_output",
    "release",
    "salloc_job_id",
]

log = logging.getLogger("srtr")

POLL_PERIOD = 2.0
STEP_GONE_TIMEOUT = 15.0
# After their SIGKILL, steps on nodes that answer leave squeue within about a second. One
# still listed after this is on a node that does not answer (a partition, or a dead node
# SLURM has not marked DOWN yet): it is cancelled, and close does not wait for it.
STEP_KILL_WAIT = 1.0


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
            self._exited,
            command=self._command,
            environment=self._environment,
            owner=self.name,
            memory_cgroups=False,  # SLURM's: srun --mem
        )
        self.allocation = allocation
        self.job_id = allocation.job_id
        self.commands = commands or SlurmCommands()
        self.capabilities = Capabilities(containers=pyxis, walltime=True)
        self.poll_period = poll_period
        self._steps: dict[str, str] = {}  # instance name → step id of its live attempt
        self._seen: set[str] = set()  # names whose step squeue has shown
        self._missing: dict[str, int] = {}  # name → polls its step was not listed
        self._lost: dict[tuple[str, int], str] = {}  # (name, attempt) → why it is lost
        self._down: dict[str, str] = {}  # node → state, while down
        self._node: dict[str, str] = {}  # instance name → node of its live attempt
        self._log: dict[str, tuple[Path, int]] = {}  # name → (log, size when it started)
        self._poller: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()  # adopted exits, lost steps' scancel
        self._kill_watches: set[asyncio.Task[None]] = set()  # `_unanswered_kill`s
        self._abandoned: set[str] = set()  # steps cancelled on nodes that did not answer

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
                memory=spec.memory_limit,
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
        live = self._groups.get(name)
        if signum == 9 and live is not None:
            watch = asyncio.get_running_loop().create_task(
                self._unanswered_kill(name, live.attempt, step)
            )
            self._kill_watches.add(watch)
            watch.add_done_callback(self._kill_watches.discard)

    async def _unanswered_kill(self, name: str, attempt: int, step: str) -> None:
        """A step that outlives its SIGKILL by STEP_KILL_WAIT is on a node that does not
        answer: end its srun client (which waits on that node for minutes) and cancel the
        step, rather than keep a teardown waiting (15 s and more in a partition).
        Its exit is then the srun client's: killed by signal 9, as the caller asked."""
        await asyncio.sleep(STEP_KILL_WAIT)
        live = self._groups.get(name)
        if live is None or live.attempt != attempt:
            return
        log.warning(
            "slurm: %s (step %s) still runs %gs after its SIGKILL: its node does not answer; "
            "its srun client is killed and the step cancelled",
            name,
            step,
            STEP_KILL_WAIT,
        )
        kill_group(live.pgid)
        self._abandoned.add(step)
        argv = slurm_cmd.scancel_cancel_steps_argv(self.job_id, [step])
        with contextlib.suppress(SlurmError):
            await self.commands.arun(argv, check=False)

    async def _find_step(self, name: str) -> str | None:
        await self._poll_once()
        return self._steps.get(name)

    # -- observing ------------------------------------------------------------------------

    def _exited(self, attempt: Attempt, status: ExitStatus | None) -> None:
        if self._listener is None:
            return
        if status is None:
            # An adopted srun client is not our child: its status is unknown, and whether its
            # node died takes a look at SLURM (`_adopted_exit`), later, off this callback.
            self._later(self._adopted_exit(attempt))
            return
        self._listener(self._exit_observation(attempt, status))

    async def _adopted_exit(self, attempt: Attempt) -> None:
        """Report an adopted srun client's exit: LOST when its node was lost (noted by the
        poller, or DOWN in `scontrol` now), else an exit of unknown status."""
        node = self._node.get(attempt.name) or attempt.node
        why = self._lost.pop((attempt.name, attempt.attempt), None)
        if why is None and node in self._down:
            why = f"node {node} is {self._down[node]}"
        elif why is None and node:
            row = (await self._node_rows([node])).get(node)
            why = f"node {node} is {row.state}" if row is not None and row.down else None
        observation = dataclasses.replace(
            exited(attempt, None), step=self._steps.pop(attempt.name, None)
        )
        if why is not None:
            observation = dataclasses.replace(
                observation, kind=ObservationKind.LOST, exit_code=None, message=why
            )
        if self._listener is not None:
            self._listener(observation)

    async def _node_rows(self, nodes: list[str]) -> dict[str, slurm_cmd.NodeRow]:
        try:
            done = await self.commands.arun(slurm_cmd.scontrol_show_node_argv(nodes), check=False)
        except SlurmError as exc:
            log.warning("slurm: %s", exc)
            return {}
        return slurm_cmd.parse_scontrol_nodes(done.stdout) if done.returncode == 0 else {}

    def _exit_observation(self, attempt: Attempt, status: ExitStatus) -> Observation:
        """What a reaped srun client means: LOST with its node, else the step's exit."""
        step = self._steps.pop(attempt.name, None)
        why = self._lost.pop((attempt.name, attempt.attempt), None)
        if why is not None:
            lost = ObservationKind.LOST
            return Observation(lost, attempt.name, attempt.attempt, attempt.pid, step, message=why)
        last_words = _srun_last_words(*self._log.get(attempt.name, (None, 0)))
        failed_node = slurm_cmd.parse_srun_node_failure(last_words)
        if failed_node is not None:
            return Observation(
                kind=ObservationKind.LOST,
                name=attempt.name,
                attempt=attempt.attempt,
                pid=attempt.pid,
                step=step,
                message=f"node failure on {failed_node}",
            )
        oom = OOM_KILLED if status.code and slurm_cmd.parse_srun_oom(last_words) else ""
        return dataclasses.replace(exited(attempt, status), step=step, reason=oom)

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
        self._lost[(name, attempt.attempt)] = why
        # The srun client may hang on a dead node for minutes; its exit, reported as LOST by
        # _exit_observation, is what frees the instance.
        kill_group(attempt.pgid)
        step = self._steps.get(name)
        if step is not None:
            # A node that is lost but alive (drained) would run the step's tasks on until the
            # allocation ends: cancel the step too (a dead node's slurmctld does that later).
            self._later(self._cancel(step))

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _cancel(self, step: str) -> None:
        with contextlib.suppress(SlurmError):  # best effort: the allocation's end does it too
            await self.commands.arun(slurm_cmd.scancel_step_argv(self.job_id, step, 9), check=False)

    def _report(self, kind: ObservationKind, name: str, *, step: str | None = None) -> None:
        attempt = self._groups.get(name)
        if self._listener is not None and attempt is not None:
            self._listener(
                Observation(
                    kind=kind, name=name, attempt=attempt.attempt, pid=attempt.pid, step=step
                )
            )

    def has_program(self, what: str, name: str) -> bool:
        return host_has_program(what, name)

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
        for watch in list(self._kill_watches):
            watch.cancel()  # what close kills it waits for itself, and briefly
        steps = [s for n, s in self._steps.items() if n in self._groups]
        killed = time.monotonic()
        if steps:
            argv = slurm_cmd.scancel_steps_argv(self.job_id, steps, "KILL")
            with contextlib.suppress(SlurmError):
                await self.commands.arun(argv, check=False)
        await self._groups.close()
        if self._pending:  # adopted exits still being looked into: report them first
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        await self._wait_steps_gone(killed)
        await asyncio.to_thread(self.release_allocation)

    def release_allocation(self) -> None:
        """Give back the allocation if srtr asked for it: `close` does, and so does the CLI
        for a job that ends before it ever ran."""
        if self.allocation.owned:
            release(self.commands, self.job_id)

    async def _wait_steps_gone(self, since: float) -> None:
        """Until squeue lists none of our steps; `since`: when they were sent SIGKILL."""
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
                and r.step_id not in self._abandoned  # cancelled already: not waited for
            ]
            if done.returncode != 0 or not ours:
                return
            if time.monotonic() - since >= STEP_KILL_WAIT:
                await self._abandon(ours)
                return
            await asyncio.sleep(0.2)
        log.warning("slurm: steps still listed %gs after close", STEP_GONE_TIMEOUT)

    async def _abandon(self, rows: list[slurm_cmd.StepRow]) -> None:
        """Cancel steps whose nodes did not carry out their SIGKILL, and stop waiting for
        them: slurmctld ends them when their nodes answer again (or are marked DOWN)."""
        log.warning(
            "slurm: %d step(s) still listed %gs after their SIGKILL, on %s: their nodes do "
            "not answer (a partition?); cancelled, not waited for",
            len(rows),
            STEP_KILL_WAIT,
            ", ".join(sorted({r.nodes for r in rows})),
        )
        argv = slurm_cmd.scancel_cancel_steps_argv(self.job_id, [r.step_id for r in rows])
        with contextlib.suppress(SlurmError):
            await self.commands.arun(argv, check=False)


def _instance_env(spec: LaunchSpec) -> dict[str, str]:
    return {
        **spec.env,
        "SRTR_NODE": spec.node,
        "SRTR_NODE_IP": spec.node_ip,
        "SRTR_INSTANCE": spec.name,
    }


def _srun_last_words(path: Path | None, start: int) -> str:
    """The end of this attempt's log, where srun's own last words are: srun exits 0 when
    its step's node fails, and says when the step met the OOM killer."""
    if path is None:
        return ""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(start, size - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return tail
