"""SLURM allocations and the command runner every SLURM call goes through.

Discovery inside an allocation (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, NodeAddr from
scontrol), `salloc --no-shell` from outside (under `setpriv --pdeathsig`, so a killed srtr
withdraws a pending request), and the release of an allocation srtr made.

Every call to a SLURM command goes through `SlurmCommands.run`, which retries transient
failures ("Socket timed out", "Unable to contact slurm controller") with tenacity, with a
bounded exponential backoff, and logs each retry; a command that still fails is reported,
never raised into the controller loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import tenacity

from srtr.backends.base import NodeInfo
from srtr.backends.pdeathsig import dies_with_us
from srtr.backends.slurm import cmd as slurm_cmd

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


SALLOC_MISSING = "salloc not found: is SLURM installed? (use --backend local)"


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
        try:
            proc = subprocess.Popen(
                dies_with_us(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fd
            )
        except FileNotFoundError:
            raise SlurmError(SALLOC_MISSING) from None
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
