"""A node whose link goes down (issue 22): no FIN, no RST, its processes run on, cut off.

On the separate-hosts cluster (scripts/slurm-cluster), with the controller on the host:

- the default launcher (the node agent): the cut-off node's agent, its heartbeats no longer
  acknowledged, fences itself (SIGTERM, SIGKILL after the grace to the rider that ignores
  SIGTERM), and only then does the spare start the lost owner's replacement
  (`replace_lost`): one instance never runs twice. SIGTERM to srtr during the partition
  then tears the job down;
- the step launcher: SIGTERM to srtr during a partition cancels the cut-off node's steps
  rather than wait on them.

How long each takes is in benchmarks/slurm_partition.py; here only what happens, in order.
"""

from __future__ import annotations

import datetime
import json
import signal
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import wait_for
from tests.support.slurm_launchers import instance_processes, no_job_left, node_of, start, strays_on

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


# Two nodes in the pool (srtr cuts the second one's link), two spares.
PART = """
name: hpart
services:
  - name: svc
    command: ["sleep", "1000"]
    nodes: 2
    critical: true
    replace_lost: true
    stop_grace_seconds: 1
  - name: rider
    command: ["bash", "-c", "trap '' TERM; exec sleep 1000"]
    placement: {pool: svc}
    stop_grace_seconds: 1
"""


def running(state: dict) -> bool:
    return state["job"]["phase"] == "Running" and all(
        i["pid"] is not None and i["phase"] == "Running" for i in state["instances"]
    )


def _gone(pids: list[int]) -> bool:
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def _log_time(line: str) -> float:
    """The wall-clock time of one agent log line ("2026-12-02 07:00:01,234 LEVEL ...")."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def test_a_cut_off_node_fences_itself_before_its_replacement_starts(tmp_path: Path) -> None:
    run = start("host", tmp_path, PART, "--backend", "slurm", nodes=4, name="srtr-hpart")
    cut = ""
    try:
        state = run.wait_state(running, 90, "every instance running")
        assert state["job"]["launcher"] == "agent"  # the default on SLURM
        cut = state["carve"]["pools"]["svc"][1]  # SLURM picks the nodes
        spare = state["carve"]["spares"][0]
        victims = [
            p for n in ("svc", "rider") for p in instance_processes(run, f"service_{n}_{cut}")
        ]
        assert len(victims) == 2 and {node_of(p) for p in victims} == {cut}
        slurm_util.cut(cut)
        wait_for(lambda: _gone(victims), 60, f"the instances on {cut} to be stopped by its agent")
        state = run.wait_state(
            lambda s: any(
                (i["name"], i["phase"]) == (f"service_svc_{spare}", "Running")
                for i in s["instances"]
            ),
            60,
            "the spare to run the lost owner's replacement",
        )
        (new,) = wait_for(lambda: instance_processes(run, f"service_svc_{spare}"), 30, "it runs")
        assert node_of(new) == spare
        assert state["carve"]["lost"] == [cut]  # the replacement dropped its instances

        # The agent's own account, and the order: fenced (the last instance killed) before
        # the replacement was launched.
        log = (run.run_dir / "logs" / f"agent-{cut}.log").read_text()
        assert "no word from the controller" in log and "fencing" in log, log
        assert f"fenced service_rider_{cut} still running 1s after SIGTERM: SIGKILL" in log, log
        fenced = [_log_time(line) for line in log.splitlines() if "fenced service_" in line]
        events = [json.loads(x) for x in (run.run_dir / "events.jsonl").read_text().splitlines()]
        launched = next(
            e["ts"]
            for e in events
            if (e["reason"], e["object"]) == ("Launched", f"instance/service_svc_{spare}")
        )
        assert max(fenced) <= launched, (fenced, launched)
        assert any(e["reason"] == "Fencing" for e in events)

        run.signal(signal.SIGTERM)  # during the partition
        assert run.wait(120) == 143, run.out + run.err
        # What runs on the cut-off node is its agent alone (it waits for a controller, as
        # after a crash); SLURM ends it with the job once the link is back.
        elsewhere = [p for p in run.leftovers() if node_of(p) != cut]
        assert not elsewhere, elsewhere
    finally:
        if cut:
            slurm_util.mend(cut)
        run.close()
    wait_for(lambda: not run.leftovers(), 60, "every process of the run to be gone")
    no_job_left("srtr-hpart")
    for node in (*state["carve"]["pools"]["svc"], cut):
        wait_for(lambda n=node: not strays_on(n), 60, f"nothing left on {node}")


STEPS = """
name: hstep
services:
  - name: svc
    command: ["bash", "-c", "trap '' TERM; exec sleep 1000"]
    nodes: 2
    stop_grace_seconds: 1
"""


def test_teardown_in_a_partition_cancels_the_unreachable_step(tmp_path: Path) -> None:
    """Step launcher: the cut-off node's step cannot be signalled; srtr cancels it and
    its srun client rather than wait on them."""
    run = start(
        "host",
        tmp_path,
        STEPS,
        "--backend",
        "slurm",
        "--launcher",
        "step",
        nodes=2,
        name="srtr-hstep",
    )
    cut = ""
    try:
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and all(i["step"] is not None for i in s["instances"])
            ),
            90,
            "every step running",
        )
        cut = state["carve"]["pools"]["svc"][1]  # SLURM picks the nodes
        slurm_util.cut(cut)
        run.signal(signal.SIGTERM)
        assert run.wait(120) == 143, run.out + run.err
    finally:
        if cut:
            slurm_util.mend(cut)
        run.close()
    wait_for(lambda: not run.leftovers(), 60, "every process of the run to be gone")
    log = (run.run_dir / "logs" / "srtr.log").read_text()
    assert "its node does not answer; its srun client is killed and the step cancelled" in log
    no_job_left("srtr-hstep")
    for node in state["carve"]["pools"]["svc"]:
        wait_for(lambda n=node: not strays_on(n), 60, f"nothing left on {node}")
