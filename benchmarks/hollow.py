"""Hollow agents (kubemark-style): 1,024 nodes on one machine, each its own agent connection.

`srtr up --headless --hollow` on the local backend: ONE hollow process runs the real node
agent 1,024 times (own TCP connection, handshake and heartbeats each) on simulated processes
(docs/agents.md, "Hollow mode"); 1,024 nodes × 4 services (owner + 3 riders) = 4,096
instances. Figures:

- all 4,096 Running (`Launched`) from `srtr up` starting, and from the first stage's start;
- the controller's RSS and CPU % of one core while idle (10 s), once all are Running: its
  cost of 1,024 live agent connections and their heartbeats;
- node loss through the channel: a hollow node killed (its connection dropped) → `NodeLost`,
  and a hollow node frozen (silent, its connection open) → `NodeLost` (the heartbeat path);
- SIGTERM to `srtr up` → the controller and the hollow process both gone;

and on real agents (`--launcher agent`, 4 nodes, one process each): an agent SIGKILLed →
`NodeLost`, and an agent SIGSTOPped (silent) → `NodeLost`. No baseline: nothing else here
runs a thousand agents.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Figure, Job, alive, idle_sample, write_yaml
from srtr.backends.agent.channel import READ_PERIOD

SERVICES = ("base", "side1", "side2", "side3")
RUNNING_TARGET = 10.0  # s
RSS_TARGET = 300.0  # MB
CPU_TARGET = 1.0  # % of one core
LOSS_TARGET = 3.0  # s


def sizes(ctx: Context) -> tuple[int, float]:
    """(nodes, idle seconds): the full run's idle sample spans two whole laps of the
    controller's periodic reads, so that its phase does not decide the figure."""
    return (256, 5.0) if ctx.quick else (1024, 2 * READ_PERIOD)


def recipe(path: Path, nodes: int) -> Path:
    services: list[dict[str, Any]] = [
        {"name": "base", "command": ["sleep", "infinity"], "nodes": nodes}
    ]
    for name in SERVICES[1:]:
        services.append(
            {"name": name, "command": ["sleep", "infinity"], "placement": {"pool": "base"}}
        )
    return write_yaml(path, {"name": "hollow", "services": services})


def pids_with(*needles: str) -> list[int]:
    """Processes whose command line holds every one of `needles`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(n in argv for n in needles):
            found.append(int(entry))
    return found


def node_lost(job: Job, node: str, seen: int, timeout: float = 30) -> dict[str, Any]:
    def lost(events: list[dict[str, Any]]) -> Any:
        for e in events[seen:]:
            if e["reason"] == "NodeLost" and f"on {node}:" in e["message"]:
                return e
        return None

    return job.wait(lost, timeout=timeout, step=0.01)  # type: ignore[no-any-return]


def control(job: Job, line: str) -> float:
    """Send one line to the hollow process's control FIFO; when it was sent (time.time())."""
    fd = os.open(job.run_dir / "hollow.ctl", os.O_WRONLY | os.O_NONBLOCK)
    try:
        at = time.time()
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
    return at


def hollow_run(ctx: Context, where: Path) -> dict[str, Any]:
    nodes, idle_s = sizes(ctx)
    total = nodes * len(SERVICES)
    path = recipe(where / "hollow.yaml", nodes)
    out: dict[str, Any] = {"instances": total, "nodes": nodes}
    run_dir = where / "run"
    with Job(path, run_dir, extra=["--hollow"]) as job:
        from_up, from_stage = job.all_launched(total, timeout=300, step=0.1)
        out["all_running_from_up_s"], out["all_running_from_stage_s"] = from_up, from_stage
        ctx.log(
            f"hollow: {total} Running on {nodes} hollow nodes "
            f"{out['all_running_from_up_s']:.2f}s after `srtr up` "
            f"({out['all_running_from_stage_s']:.2f}s after the first stage began)"
        )
        hollow = pids_with("srtr.backends.agent.hollow", str(run_dir))
        assert len(hollow) == 1, f"expected one hollow process, found {hollow}"
        time.sleep(3)  # let the last state.json write pass
        out["idle"] = idle_sample(job.pid, idle_s)
        out["hollow_idle"] = idle_sample(hollow[0], 2.0)
        ctx.log(
            f"hollow: controller idle {out['idle']['cpu_percent']:.2f}% CPU, RSS "
            f"{out['idle']['rss_peak_mb']:.0f} MB; hollow process "
            f"{out['hollow_idle']['cpu_percent']:.1f}% CPU, {out['hollow_idle']['rss_mb']:.0f} MB"
        )
        for verb, node in (("kill", "node1"), ("freeze", "node2")):
            job.poll_events()
            seen = len(job.events)
            at = control(job, f"{verb} {node}")
            out[f"{verb}_to_node_lost_s"] = node_lost(job, node, seen)["ts"] - at
            ctx.log(f"hollow: {verb} {node} → NodeLost {out[f'{verb}_to_node_lost_s']:.2f}s")
        t0 = time.time()
        job.proc.send_signal(signal.SIGTERM)
        job.proc.wait(120)
        while alive(hollow[0]) and time.time() - t0 < 120:
            time.sleep(0.01)
        out["sigterm_all_gone_s"] = time.time() - t0
        out["hollow_gone"] = not alive(hollow[0])
        ctx.log(
            f"hollow: SIGTERM → controller and hollow process gone {out['sigterm_all_gone_s']:.2f}s"
        )
    return out


REAL = {
    "name": "realloss",
    "services": [{"name": "svc", "command": ["sleep", "infinity"], "nodes": 4}],
}


def real_loss(ctx: Context, where: Path) -> dict[str, Any]:
    """Real agents (one process per node): SIGKILL one, SIGSTOP another → NodeLost."""
    path = write_yaml(where / "real.yaml", REAL)
    out: dict[str, Any] = {}
    run_dir = where / "real-run"
    with Job(path, run_dir, extra=["--launcher", "agent"]) as job:
        job.wait(lambda ev: job.count("Launched") >= 4, timeout=60)
        stopped = []
        for signum, node in ((signal.SIGKILL, "node1"), (signal.SIGSTOP, "node2")):
            agent = pids_with("srtr.backends.agent.node", "--node " + node + " ", str(run_dir))
            assert len(agent) == 1, f"expected one agent of {node}, found {agent}"
            job.poll_events()
            seen = len(job.events)
            at = time.time()
            os.kill(agent[0], signum)
            if signum == signal.SIGSTOP:
                stopped.append(agent[0])
            name = signal.Signals(signum).name
            out[f"{name}_to_node_lost_s"] = node_lost(job, node, seen)["ts"] - at
            ctx.log(f"hollow: real agent {name} → NodeLost {out[f'{name}_to_node_lost_s']:.2f}s")
        for pid in stopped:  # let it see its Shutdown and exit
            os.kill(pid, signal.SIGCONT)
        job.stop(timeout=60)
    return out


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("hollow")
    ours = hollow_run(ctx, where)
    real = real_loss(ctx, where)
    n, nodes = ours["instances"], ours["nodes"]
    what = f"{nodes} hollow agents × {len(SERVICES)}"
    return [
        Figure(
            "hollow",
            f"{what}: all {n} Running, from `srtr up`",
            ours["all_running_from_up_s"],
            "s",
            target=RUNNING_TARGET,
            note=f"{ours['all_running_from_stage_s']:.2f}s from the first stage's start",
            extra={"hollow": ours, "real": real},
        ),
        Figure(
            "hollow",
            f"{what}: controller RSS, all Running",
            ours["idle"]["rss_peak_mb"],
            "MB",
            target=RSS_TARGET,
            note=f"hollow process {ours['hollow_idle']['rss_mb']:.0f} MB",
        ),
        Figure(
            "hollow",
            f"{what}: controller CPU while idle ({ours['idle']['seconds']:.0f}s)",
            ours["idle"]["cpu_percent"],
            "%",
            target=CPU_TARGET,
            note=f"% of one core; hollow process {ours['hollow_idle']['cpu_percent']:.1f}%",
        ),
        Figure(
            "hollow",
            "hollow node frozen (silent) → NodeLost",
            ours["freeze_to_node_lost_s"],
            "s",
            target=LOSS_TARGET,
            note=f"killed (connection dropped): {ours['kill_to_node_lost_s']:.3f}s",
        ),
        Figure(
            "hollow",
            "real agent SIGSTOPped (silent) → NodeLost",
            real["SIGSTOP_to_node_lost_s"],
            "s",
            target=LOSS_TARGET,
            note=f"SIGKILLed: {real['SIGKILL_to_node_lost_s']:.3f}s",
        ),
        Figure(
            "hollow",
            f"{what}: SIGTERM → controller and hollow process gone",
            ours["sigterm_all_gone_s"],
            "s",
            note="" if ours["hollow_gone"] else "the hollow process outlived 120 s",
        ),
    ]
