"""No SLURM allocation outlives a killed `srtr up` (real slurmctld, real salloc).

Three windows: srtr killed while salloc waits (salloc dies with srtr and withdraws the
request), killed after the grant but before any state.json (the guard, started before salloc
and holding the memfd salloc writes the job id to, cancels it), and a guard whose state lacks
the job (its argv names it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import Run, cmdlines_with, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[3]
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


def states(name: str) -> list[str]:
    """The states of the SLURM jobs called `name`, finished ones included while listed."""
    return slurm_util.squeue("-t", "all", "-n", name, "-o", "%T").split()


def salloc(name: str, nodes: int) -> str:
    done = subprocess.run(
        ["salloc", "--no-shell", "--exclusive", "-N", str(nodes), "-J", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=slurm_util.outside_env(),
    )
    return done.stderr.split("Granted job allocation")[1].split()[0]


@contextlib.contextmanager
def holding_every_node() -> Iterator[str]:
    """An allocation of every node, so that any other request pends until it ends."""
    nodes = len(slurm_util.cluster_nodes())
    name = f"hold-{uuid.uuid4().hex[:6]}"
    job = salloc(name, nodes)
    try:
        yield job
    finally:
        subprocess.run(["scancel", job], check=False)


def cancel(name: str) -> None:
    """A failing test must not leave a job that starves the tests after it."""
    if set(states(name)) & LIVE:
        subprocess.run(["scancel", "-n", name], check=False)


def pend(name: str) -> None:
    wait_for(lambda: states(name) == ["PENDING"], 60, f"the salloc of {name} to pend")


def withdrawn(name: str) -> None:
    """Wait until no job `name` pends or runs any more."""
    wait_for(lambda: not set(states(name)) & LIVE, 30, f"the job {name} to be withdrawn")


def salloc_gone(name: str) -> None:
    wait_for(lambda: not cmdlines_with(f"\0{name}\0"), 30, f"the salloc of {name} to exit")


def recipe(name: str) -> str:
    return f'name: {name}\nservices:\n  - name: one\n    command: ["sleep", "1000"]\n'


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_a_signal_while_salloc_pends_withdraws_the_request(tmp_path: Path, signum: int) -> None:
    """kill -9: salloc dies with srtr (and the guard cancels the job too); SIGTERM: srtr
    cancels it itself and exits 128 + 15."""
    name = f"kpend{uuid.uuid4().hex[:6]}"
    with holding_every_node():
        run = Run(tmp_path, recipe(name), "--backend", "slurm", env=slurm_util.outside_env())
        try:
            pend(f"srtr-{name}")
            run.signal(signum)
            assert run.wait() == (-9 if signum == signal.SIGKILL else 143), run.err
            # Withdrawn while every node is still held: it can never have run.
            withdrawn(f"srtr-{name}")
        finally:
            run.close()
            cancel(f"srtr-{name}")
    salloc_gone(f"srtr-{name}")
    assert "RUNNING" not in states(f"srtr-{name}")


def test_a_pending_salloc_dies_with_its_parent_even_without_a_guard(tmp_path: Path) -> None:
    """Window 1 on its own: `slurm.allocate` in a process that is SIGKILLed while its job
    pends, with no guard anywhere; salloc gets SIGTERM from the kernel and cancels."""
    name = f"nguard{uuid.uuid4().hex[:6]}"
    code = (
        "from srtr.backends.slurm import backend as slurm\n"
        f"slurm.allocate(slurm.SlurmCommands(), nodes=1, job_name={name!r}, partition=None,"
        " account=None, time_limit=None)\n"
    )
    env = {**slurm_util.outside_env(), "PYTHONPATH": str(ROOT)}
    with holding_every_node():
        parent = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path)
        try:
            pend(name)
            parent.kill()
            parent.wait()
            withdrawn(name)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            cancel(name)
    salloc_gone(name)
    assert "RUNNING" not in states(name)


def test_kill_9_after_the_grant_before_any_state_releases_the_allocation(tmp_path: Path) -> None:
    """Window 2: srtr is stopped while its job pends, the job is granted (salloc exits, so
    no death signal can help), and srtr is killed before it read salloc's answer or wrote
    anything: the guard it started before salloc finds the job in salloc's output (a memfd
    it holds) and cancels the allocation."""
    name = f"kgrant{uuid.uuid4().hex[:6]}"
    job = f"srtr-{name}"
    with holding_every_node():
        run = Run(tmp_path, recipe(name), "--backend", "slurm", env=slurm_util.outside_env())
        try:
            pend(job)
            run_dir = str(run.run_dir)
            wait_for(lambda: guards_of(run_dir), 30, "the guard to start while the job pends")
            run.signal(signal.SIGSTOP)
        except BaseException:
            run.close()
            raise
    try:
        wait_for(lambda: states(job) == ["RUNNING"], 60, "the job to be granted")
        assert not (run.run_dir / "state.json").exists()
        run.proc.kill()
        run.wait()
        withdrawn(job)
        wait_for(lambda: not guards_of(run_dir), 30, "the guard to exit")
    finally:
        run.close()
        cancel(job)


def guards_of(run_dir: str) -> list[tuple[int, str]]:
    return [(pid, line) for pid, line in cmdlines_with("srtr.runtime.guard") if run_dir in line]


@pytest.mark.parametrize("adopted", [False, True], ids=["orphaned", "adopted"])
def test_the_guard_cancels_the_job_its_argv_names_unless_adopted(
    tmp_path: Path, adopted: bool
) -> None:
    """Window 3: the state the guard reads lacks the allocation (written before it was
    known, or by a controller that recorded none); the job named by --slurm-job is cancelled
    all the same, unless a live successor adopted the run dir."""
    name = f"gargv{uuid.uuid4().hex[:6]}"
    job_id = salloc(name, 1)
    hold = [sys.executable, "-c", "import time; time.sleep(600)"]
    controller = subprocess.Popen(hold)
    successor = subprocess.Popen(hold)
    try:
        run_dir = tmp_path / "run"
        (run_dir / "logs").mkdir(parents=True)
        owner = successor.pid if adopted else controller.pid
        doc = {"job": {"phase": "Running", "controller_pid": owner, "backend": "slurm"}}
        (run_dir / "state.json").write_text(json.dumps(doc))
        argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(controller.pid)]
        env = {**slurm_util.outside_env(), "PYTHONPATH": str(ROOT)}
        guard = subprocess.Popen([*argv, "0", "--slurm-job", job_id], env=env)
        controller.kill()
        controller.wait()
        assert guard.wait(timeout=60) == 0
        if adopted:
            assert states(name) == ["RUNNING"]
        else:
            withdrawn(name)
            log = (run_dir / "logs" / "srtr.log").read_text()
            assert f"cancelled SLURM job {job_id}" in log
    finally:
        for proc in (controller, successor):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        subprocess.run(["scancel", job_id], check=False)


def test_up_without_setpriv_says_so_and_still_releases(tmp_path: Path) -> None:
    """No setpriv on PATH: a log line says so; the guard still withdraws a pending job."""
    name = f"nopriv{uuid.uuid4().hex[:6]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = os.environ.get("PATH", "")
    for tool in ("salloc", "squeue", "scancel", "scontrol", "srun"):
        found = subprocess.run(["which", tool], capture_output=True, text=True, env={"PATH": path})
        (bin_dir / tool).symlink_to(found.stdout.strip())
    env = {**slurm_util.outside_env(), "PATH": f"{bin_dir}:{Path(sys.executable).parent}"}
    with holding_every_node():
        run = Run(tmp_path, recipe(name), "--backend", "slurm", env=env)
        try:
            pend(f"srtr-{name}")
            run_dir = str(run.run_dir)
            wait_for(lambda: guards_of(run_dir), 30, "the guard to start while the job pends")
            run.proc.kill()
            run.wait()
            withdrawn(f"srtr-{name}")
        finally:
            run.close()
            cancel(f"srtr-{name}")
    assert "setpriv --pdeathsig (util-linux) is not available" in run.err
    assert "RUNNING" not in states(f"srtr-{name}")


def test_the_guard_leaves_the_job_an_old_ended_state_names(tmp_path: Path) -> None:
    """A reused run dir's state.json of an ended job of another controller: its job id is
    not ours (a restarted cluster gives ids out again), so the guard must not cancel it."""
    name = f"gold{uuid.uuid4().hex[:6]}"
    job_id = salloc(name, 1)  # someone else's job that got the old id
    hold = [sys.executable, "-c", "import time; time.sleep(600)"]
    controller = subprocess.Popen(hold)
    try:
        run_dir = tmp_path / "run"
        (run_dir / "logs").mkdir(parents=True)
        job = {"phase": "Succeeded", "controller_pid": 1, "backend": "slurm"}
        job |= {"slurm_job_id": job_id, "owns_allocation": True}
        (run_dir / "state.json").write_text(json.dumps({"job": job}))
        argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(controller.pid)]
        env = {**slurm_util.outside_env(), "PYTHONPATH": str(ROOT)}
        guard = subprocess.Popen([*argv, "0"], env=env)
        controller.kill()
        controller.wait()
        assert guard.wait(timeout=60) == 0
        assert states(name) == ["RUNNING"]
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
        subprocess.run(["scancel", job_id], check=False)
