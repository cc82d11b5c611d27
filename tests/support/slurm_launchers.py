"""What the SLURM end-to-end suites share: the launchers they run under, where the
controller runs (`PLACES`, `start`), the HOLD recipe and how to tell that its instances run,
the job's steps, and a node SLURM drains."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import Run, processes_with, wait_for

finish = functools.partial(Run.finish, timeout=120.0)

# The tests that matter run under both SLURM launchers: an srun step per instance, and a
# node agent per node (issue 15: the agent path passes the step path's tests).
LAUNCHERS = pytest.mark.parametrize("launcher", ["step", "agent"])


# Where the controller runs: on the host, outside the job's nodes, as from an interactive
# `salloc` on a login node; or on the job's first node, as the batch script of `sbatch` does
# (on the separate-hosts cluster: in that node's namespaces, its own network and /tmp).
PLACES = pytest.mark.parametrize("where", ["host", "node"])


class BatchRun(Run):
    """`srtr up` as the batch script of `sbatch --wait`: it runs on the job's first node.
    `proc` is the waiting sbatch; the controller's own stdout and stderr are the job's
    output files, which `out` and `err` take in after it ends."""

    def __init__(self, tmp_path: Path, recipe: str, *extra: str, nodes: int, name: str) -> None:
        script = tmp_path / "batch.sh"
        script.write_text('#!/bin/sh\nexec "$@"\n')
        self.job_out = tmp_path / "job.out"
        self.job_err = tmp_path / "job.err"
        self.job_id = ""
        batch = ("sbatch", "--wait", "--parsable", f"-N{nodes}", "-J", name)
        files = ("-o", str(self.job_out), "-e", str(self.job_err), str(script))
        super().__init__(
            tmp_path, recipe, *extra, prefix=(*batch, *files), env=slurm_util.outside_env()
        )

    def job(self) -> str:
        """The batch job's id (`sbatch --parsable` prints it first)."""
        if not self.job_id:
            self.job_id = wait_for(
                lambda: self.stdout_so_far().strip().split(";")[0], 60, "sbatch's job id"
            )
        return self.job_id

    def signal(self, signum: int = signal.SIGINT) -> None:
        """The signal to the controller: the batch script is `exec srtr up`."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        subprocess.run(["scancel", "--batch", f"--signal={name}", self.job()], check=True)

    def close(self) -> None:
        """After a failure: the batch job (a killed `sbatch --wait` leaves it running)."""
        if self.proc.poll() is None and self.job_id:
            subprocess.run(["scancel", self.job_id], check=False)
        super().close()

    def _collect(self) -> None:
        super()._collect()
        for path, attr in ((self.job_out, "out"), (self.job_err, "err")):
            if path.exists():
                setattr(self, attr, getattr(self, attr) + path.read_text(errors="replace"))


class HostRun(Run):
    """`srtr up` on the host inside `salloc -N NODES` (an interactive allocation on a login
    node): signals go to the controller itself, not to salloc."""

    def __init__(self, tmp_path: Path, recipe: str, *extra: str, nodes: int, name: str) -> None:
        super().__init__(
            tmp_path,
            recipe,
            *extra,
            prefix=("salloc", f"-N{nodes}", "-J", name),
            env=slurm_util.outside_env(),
        )

    def signal(self, signum: int = signal.SIGINT) -> None:
        state = self.wait_state(lambda s: s["job"].get("controller_pid"), 60, "a controller")
        os.kill(state["job"]["controller_pid"], signum)

    def close(self) -> None:
        """After a failure: the controller (salloc's child) and salloc's allocation, which
        outlive a killed salloc."""
        if self.proc.poll() is None:
            state = self.state()
            pid = state["job"].get("controller_pid") if state else None
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            said = self.stderr_so_far().split("job allocation ")
            if len(said) > 1:
                subprocess.run(["scancel", said[1].split()[0]], check=False)
        super().close()


def start(where: str, tmp_path: Path, recipe: str, *extra: str, nodes: int, name: str) -> Run:
    """`srtr up RECIPE *extra` with the controller on the host or on the job's first node."""
    kind = HostRun if where == "host" else BatchRun
    return kind(tmp_path, recipe, *extra, nodes=nodes, name=name)


def controller_node(state: dict[str, Any]) -> str | None:
    """The node whose network namespace the run's controller is in (None: the host's)."""
    return node_of(state["job"]["controller_pid"])


def instance_processes(run: Run, name: str) -> list[int]:
    """Pids of instance `name`'s own processes (its environment names it), on any node; not
    the srun client that started it (the step launcher's, with the same environment)."""
    return [p for p in processes_with(run.marker + "\0") if _names(p, name)]


def _names(pid: int, name: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm != "srun" and f"\0SRTR_INSTANCE={name}\0".encode() in b"\0" + environ


def node_of(pid: int) -> str | None:
    """The node whose network namespace process `pid` is in (None: the host's)."""
    mine = os.stat(f"/proc/{pid}/ns/net").st_ino
    for node, where in slurm_util.info()["nodes"].items():
        if os.stat(f"/run/netns/{where['netns']}").st_ino == mine:
            return str(node)
    return None


def strays_on(node: str) -> list[str]:
    """What runs in `node`'s network namespace besides its holder, slurmd and slurmstepd:
    after a job, nothing should."""
    where = slurm_util.info()["nodes"][node]
    listed = subprocess.run(
        ["ip", "netns", "pids", where["netns"]], capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for pid in listed:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if int(pid) != where["holder"] and comm not in ("slurmd", "slurmstepd"):
            found.append(f"{pid} {comm}")
    return found


def python_on(node: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run python `code` on `node` (the interpreter the tests run with)."""
    return slurm_util.run_on(node, [sys.executable, "-c", code])


def up(launcher: str, *extra: str) -> tuple[str, ...]:
    return ("--backend", "slurm", "--launcher", launcher, *extra)


def no_job_left(name: str) -> None:
    wait_for(lambda: slurm_util.squeue("-n", name) == "", 30, f"SLURM job {name} to be gone")


HOLD = """
name: shold
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.2}
  - name: base
    command: ["sleep", "1000"]
    start: before_workers
"""


def running(state: dict) -> bool:
    """Every instance runs: registered as a step, or (agents) running under its agent."""
    agent = state["job"]["launcher"] == "agent"
    return state["job"]["phase"] == "Running" and all(
        i["pid"] is not None and i["phase"] in ("Running", "Ready")
        if agent
        else i["step"] is not None
        for i in state["instances"]
    )


def second_node(state: dict) -> str:
    """The owner pool's second node: SLURM picks the nodes (one still completing an earlier
    job is passed over), so tests do not name them."""
    return str(state["carve"]["pools"]["owner"][1])


def job_steps(state: dict) -> list[str]:
    """`name nodes` of every step of the run's job."""
    text = slurm_util.squeue("--steps", "-j", state["job"]["slurm_job_id"], "-o", "%j %N")
    return [line.strip() for line in text.splitlines() if line.strip()]


def drain(node: str, state: str = "drain") -> None:
    """Have SLURM report `node` drained (srtr takes it as lost: docs/agents.md), or back
    (`resume`): the node's loss without the minute a dead slurmd costs."""
    argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
    subprocess.run([*argv, *(["reason=srtr-test"] if state == "drain" else [])], check=True)
