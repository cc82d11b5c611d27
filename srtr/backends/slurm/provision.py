"""SLURM as the provider of nodes past the allocation: grow jobs (docs/recipe.md, "Growing
past the allocation").

A request is one job array (`slurm_grow_cmd`): one task per node, like the main job, named
`<job name>-grow`, whose batch script runs the node's agent, which dials the controller
(the agent backend lets that many unknown nodes in: `admit`). The request is Granted once
every task runs; while one waits, the pool reads squeue's reason (`job 1234: Resources`).
A release cancels single tasks, a cancel the whole array. Every side effect is a SLURM
command run here.

squeue runs at most once per `POLL_PERIOD` for all requests together, and sooner only when
an agent of a grow job has just dialled in (`poke`): the job then runs, and the pool should
not wait a whole period more to hear it. The poke is passed on (`on_poke`: the grower's
loop wakes), so the squeue that sees the job running goes at once.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from srtr.backends.base import NodeInfo
from srtr.backends.provision import ProvisionError, RequestPhase, RequestState
from srtr.backends.slurm import grow_cmd as cmd
from srtr.backends.slurm.backend import SlurmCommands, SlurmError
from srtr.backends.slurm.cmd import parse_scontrol_nodes, scontrol_show_node_argv

log = logging.getLogger("srtr")

POLL_PERIOD = 3.0
POKE_GAP = 0.2  # the least time between two squeue runs, poked or not
SCRIPT = "grow-agent.sh"  # in the run dir


@dataclass
class _Request:
    state: RequestState
    # task number → node, for the tasks that run (and are not given back)
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    given_back: set[int] = field(default_factory=set)
    ended_by_us: bool = False


class SlurmProvisioner:
    """Grow jobs of one run, next to main job `main_job`."""

    provider = "SLURM"
    noun = "job"

    def __init__(
        self,
        commands: SlurmCommands,
        main_job: str,
        run_dir: Path,
        *,
        fingerprint: str,
        adopt_window: float,
        files: dict[str, str],
        admit: Callable[[int], None] = lambda _count: None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`files`: the run dir's agent token and rendezvous file names (the agents read
        both at start); `admit`: lets that many agents of unknown nodes join."""
        self._commands = commands
        self._main = main_job
        self._run_dir = run_dir
        self._fingerprint = fingerprint
        self._window = adopt_window
        self._files = files
        self._admit = admit
        self._python = python
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._polled = -float("inf")
        self._poked = False
        self._lock = asyncio.Lock()
        # Who follows the requests (`controllers/grow.py` sets it: it queues the `grow` key).
        self.on_poke: Callable[[], None] = lambda: None

    # -- the protocol --------------------------------------------------------------------

    async def request(self, run: str, count: int) -> str:
        if count < 1:
            raise ValueError("a grow request asks for at least one node")
        main = await self._main_job()
        script = self._script()
        logs = self._run_dir.resolve() / "logs"
        try:
            argv = cmd.sbatch_grow_argv(
                count=count,
                name=f"{run}-grow",
                main=main,
                script=script,
                output=logs / "grow-%A_%a.out",
                now=datetime.datetime.now(),
            )
        except ValueError as exc:
            raise ProvisionError(str(exc)) from None
        self._admit(count)
        try:
            # Not idempotent: a retried sbatch after a timeout may submit twice.
            done = await asyncio.to_thread(self._commands.run, argv, check=False, retry=False)
        except SlurmError as exc:
            raise ProvisionError(str(exc)) from None
        if done.returncode != 0:
            self._admit(0)
            text = (done.stderr or done.stdout).strip()
            raise ProvisionError(text.removeprefix("sbatch: error: ") or "sbatch failed")
        job = done.stdout.strip().split(";")[0]
        log.info("grow: job %s asks SLURM for %d node(s)", job, count)
        self._requests[job] = _Request(RequestState(job, count, RequestPhase.PENDING, "submitted"))
        self._polled = -float("inf")  # its first state is worth a look at once
        return job

    async def state(self, request_id: str) -> RequestState:
        await self._refresh()
        return self._requests[request_id].state

    async def release(self, request_id: str, nodes: Sequence[str]) -> RequestState:
        req = self._requests[request_id]
        if not set(nodes) <= {n.name for n in req.nodes.values()}:  # adopted: tasks unknown yet
            self._polled = -float("inf")
            await self._refresh()
        tasks = sorted(t for t, n in req.nodes.items() if n.name in set(nodes))
        if not tasks:
            return req.state
        await self._scancel(cmd.scancel_tasks_argv(request_id, tasks))
        req.given_back |= set(tasks)
        for task in tasks:
            del req.nodes[task]
        held = tuple(req.nodes[t] for t in sorted(req.nodes))
        phase = RequestPhase.GRANTED if held else RequestPhase.RELEASED
        req.ended_by_us = not held
        req.state = replace(req.state, nodes=held, phase=phase)
        return req.state

    async def cancel(self, request_id: str) -> RequestState:
        req = self._requests[request_id]
        if req.state.live:
            await self._scancel(cmd.scancel_tasks_argv(request_id, ()))
            req.ended_by_us = True
            req.nodes.clear()
            req.state = replace(req.state, phase=RequestPhase.CANCELLED, nodes=(), reason="")
        return req.state

    def requests(self) -> list[RequestState]:
        return [r.state for r in self._requests.values()]

    async def close(self) -> None:
        for rid in list(self._requests):
            await self.cancel(rid)

    # -- adoption, and the agents' hint --------------------------------------------------

    def restore(self, states: Iterable[RequestState]) -> None:
        """The requests a crashed controller recorded (state.json `grow.requests`): an
        adopting controller follows, releases and cancels them as its own."""
        for state in states:
            req = _Request(state)  # its nodes' tasks come with the first squeue
            req.ended_by_us = not state.live
            self._requests[state.id] = req
        self._polled = -float("inf")

    def poke(self) -> None:
        """An agent of a grow job dialled in: its job runs; look again soon."""
        self._poked = True
        self.on_poke()

    # -- inside --------------------------------------------------------------------------

    async def _refresh(self) -> None:
        async with self._lock:
            now = self._clock()
            due = now - self._polled >= (POKE_GAP if self._poked else POLL_PERIOD)
            live = [rid for rid, r in self._requests.items() if r.state.live]
            if not due or not live:
                return
            self._polled, self._poked = now, False
            try:
                done = await self._commands.arun(cmd.squeue_tasks_argv(live), check=False)
            except SlurmError as exc:
                log.warning("grow: squeue failed: %s; keeping the last word", exc)
                return
            text = done.stdout + done.stderr
            if done.returncode != 0 and not cmd.gone_from_queue(done.returncode, text):
                log.warning("grow: squeue failed (%d): %s", done.returncode, text.strip())
                return
            rows = cmd.parse_squeue_tasks(done.stdout)
            for rid in live:
                await self._update(rid, [r for r in rows if r.array_id == rid])

    async def _update(self, rid: str, rows: list[cmd.TaskRow]) -> None:
        req = self._requests[rid]
        state = req.state
        rows = [r for r in rows if r.task not in req.given_back and r.live]
        never = [r for r in rows if r.never]
        if never:
            await self._scancel(cmd.scancel_tasks_argv(rid, ()))
            req.ended_by_us = True
            req.state = replace(state, phase=RequestPhase.REFUSED, reason=never[0].reason)
            return
        if state.phase is RequestPhase.GRANTED:
            # By name, not task: an adopted request's tasks are known only from squeue. A
            # granted node whose task ended (not by us) is gone: its agent's loss says why.
            tasks = {r.node: r.task for r in rows if r.running}
            req.nodes = {tasks[n.name]: n for n in state.nodes if n.name in tasks}
            held = tuple(req.nodes[t] for t in sorted(req.nodes))
            phase = RequestPhase.GRANTED if held else RequestPhase.RELEASED
            req.state = replace(state, nodes=held, phase=phase)
            return
        if len(rows) < state.count:  # a pending task ended that we did not end
            await self._scancel(cmd.scancel_tasks_argv(rid, ()))
            req.ended_by_us = True
            ended = state.count - len(rows)
            req.state = replace(
                state, phase=RequestPhase.REFUSED, reason=f"{ended} task(s) of it ended"
            )
            return
        running = [r for r in rows if r.running]
        if len(running) < len(rows):
            waiting = sorted({r.reason or r.state for r in rows if not r.running})
            reason = ", ".join(waiting)
            if running:
                reason = f"{len(running)} of {len(rows)} running; the rest: {reason}"
            req.state = replace(state, reason=reason)
            return
        infos = await self._node_infos([r.node for r in running])
        req.nodes = {r.task: infos[r.node] for r in running}
        held = tuple(req.nodes[t] for t in sorted(req.nodes))
        req.state = replace(state, phase=RequestPhase.GRANTED, reason="", nodes=held)

    async def _node_infos(self, names: list[str]) -> dict[str, NodeInfo]:
        try:
            done = await self._commands.arun(scontrol_show_node_argv(names), check=False)
            rows = parse_scontrol_nodes(done.stdout)
        except SlurmError:
            rows = {}
        return {n: NodeInfo(n, rows[n].addr if n in rows and rows[n].addr else n) for n in names}

    async def _main_job(self) -> cmd.MainJob:
        try:
            done = await self._commands.arun(cmd.scontrol_show_job_argv(self._main))
        except SlurmError as exc:
            raise ProvisionError(f"cannot read the main job {self._main}: {exc}") from None
        return cmd.parse_main_job(done.stdout)

    def _script(self) -> Path:
        path = self._run_dir.resolve() / SCRIPT
        if not path.exists():
            text = cmd.grow_script(
                run=self._run_dir.name,
                run_dir=self._run_dir.resolve(),
                main_job=self._main,
                python=self._python,
                window=self._window,
                fingerprint=self._fingerprint,
                files=self._files,
            )
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.chmod(tmp, 0o700)
            os.replace(tmp, path)
        return path

    async def _scancel(self, argv: list[str]) -> None:
        try:
            await self._commands.arun(argv, check=False)
        except SlurmError as exc:
            log.warning("grow: %s failed: %s", " ".join(argv), exc)
