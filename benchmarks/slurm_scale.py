"""SLURM at 32 nodes (issue 15): 256 instances with the agent launcher, the step launcher as
the baseline column.

The job: `srtr up --backend slurm [--launcher step] --nodes 32` (the agent launcher is the
default: no flag) from outside any allocation (srtr
makes its own with salloc; "from `srtr up`" includes that), recipe = a pool of 32 `sleep`
plus 7 riders on it, 32 nodes × 8 = 256 instances. One rider is the helper's `mark` (it
appends "PID EPOCH" as its first act) with `restart: on-failure, backoff 0`. Every service
has `HF_TOKEN=<32 random hex digits>` in its env: the secret.

Measured on the head node (the one machine), once every instance runs:
- srun processes of the job (clients and their shepherds: argv starting `srun --jobid J`);
- RSS of srtr (the controller and its guard) plus those srun processes;
- the agents' RSS, one per node (on a real cluster each is on its node; here all are on this
  machine, reported apart from the head node's cost);
- the secret: every `/proc/*/cmdline` is searched for it (target none), and the `mark`
  riders' own environment must hold it (else the scan would prove nothing);
- rider SIGKILL → the new process's own mark, median and p99 over KILLS kills of random
  `mark` riders, 20-60 ms apart;
- SIGTERM to `srtr up` → every process of the job gone (the controller, srun clients,
  agents, instances, found by a tag in their environment);
- time from `srtr up` starting to the 256th `Launched` event.
Then, in a second job of the same recipe, a node dies. On the separate-hosts cluster its
link is cut (`scripts/slurm-cluster cut`): a partition, no FIN, no RST, while the node and
its processes run on. On the shared-network fallback its slurmd, its slurmstepd processes and
every process of the job on it are frozen with SIGSTOP at once, the nearest thing to a dead
host there (SIGKILL would not be: the kernel, still alive on one machine, would close the
agent's connection, which srtr reads as an agent that died on a live node). The figure is the
cut or freeze → the first `NodeLost` event. Afterwards the link is mended or the frozen
processes are killed, and the cluster healed (`scripts/slurm-cluster up`). How long
`srtr up` then takes to exit on SIGINT is printed too (no target).

Targets apply to the agent launcher; the step launcher's figures are the baseline.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Context,
    Figure,
    Job,
    alive,
    median,
    percentile,
    read_marks,
    write_yaml,
)
from benchmarks.slurm_cluster import Cluster, cluster

NODES = 32
PER_NODE = 8
VICTIM_NODE = "node17"
TAG = "SRTR_BENCH_TAG"


@dataclass
class Proc:
    pid: int
    ppid: int
    argv: list[bytes]
    environ: bytes

    def env(self, key: str) -> str | None:
        needle = key.encode() + b"="
        for item in self.environ.split(b"\0"):
            if item.startswith(needle):
                return item[len(needle) :].decode(errors="replace")
        return None


def scan(tag: str) -> list[Proc]:
    """Live processes whose environment carries `tag` (every process of one job)."""
    needle = tag.encode() + b"\0"
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ:
                continue
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            out.append(Proc(int(entry.name), int(ppid), argv, environ))
    return out


def cmdlines_with(text: str) -> list[int]:
    """Pids of every process (anyone's) whose argv holds `text`: what `ps` shows all users."""
    needle = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def is_srun(p: Proc) -> bool:
    return p.argv[0].endswith(b"srun")


def is_agent(p: Proc) -> bool:
    return b"srtr.backends.agent.node" in p.argv and not is_srun(p)


def recipe(ctx: Context, path: Path, marks: Path, secret: str) -> Path:
    env = {"HF_TOKEN": secret}
    services: list[dict[str, Any]] = [
        {"name": "pool", "command": ["sleep", "100000"], "nodes": NODES, "env": env}
    ]
    for k in range(1, PER_NODE - 1):
        services.append(
            {
                "name": f"r{k}",
                "command": ["sleep", "100000"],
                "placement": {"pool": "pool"},
                "env": env,
            }
        )
    services.append(
        {
            "name": "mark",
            "command": [ctx.helper, "mark", str(marks)],
            "placement": {"pool": "pool"},
            "restart": {"policy": "on-failure", "backoff_seconds": 0, "max_restarts": 1_000_000},
            "env": env,
        }
    )
    return write_yaml(path, {"name": "scale32", "services": services})


@dataclass
class Started:
    job: Job
    secret: str
    marks: Path
    tag: str  # "SRTR_BENCH_TAG=<hex>", in the environment of every process of the job


def start(ctx: Context, bench: Cluster, launcher: str, where: Path) -> Started:
    """`srtr up` of the 256-instance recipe, returned once every instance has run."""
    wait_nodes_idle(bench)
    secret = secrets.token_hex(16)
    marks = where / "mark.marks"
    path = recipe(ctx, where / "scale32.yaml", marks, secret)
    value = uuid.uuid4().hex
    env = {**bench.env, TAG: value}
    # The agent is SLURM's default launcher (issue 22): its job names none, as a user's would.
    args = ["--backend", "slurm", *(["--launcher", launcher] if launcher != "agent" else [])]
    job = Job(path, where / "run", nodes=NODES, extra=args, env=env, inherit_env=False)
    try:
        total = NODES * PER_NODE
        job.wait(lambda ev: job.count("Launched") >= total, timeout=600, step=0.1)
        deadline = time.monotonic() + 60
        while len(read_marks(marks)) < NODES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(read_marks(marks))}/{NODES} mark riders ran")
            time.sleep(0.05)
    except BaseException:
        job.kill()
        raise
    return Started(job, secret, marks, f"{TAG}={value}")


def wait_nodes_idle(bench: Cluster, timeout: float = 120) -> None:
    """Every node idle (the last job's allocation released), so `salloc` does not queue."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"],
            capture_output=True,
            text=True,
            env=bench.env,
            check=False,
        )
        if len(set(done.stdout.split())) >= NODES:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not idle after {timeout}s: {done.stdout!r}")
        time.sleep(0.2)


def head_cost(job: Job, tag: str) -> dict[str, Any]:
    procs = scan(tag)
    sruns = [p for p in procs if is_srun(p)]
    agents = [p for p in procs if is_agent(p)]
    ours = [p for p in procs if p.pid == job.pid or b"srtr.runtime.guard" in p.argv]
    agent_mb = [rss_mb(p.pid) for p in agents]
    return {
        "srun_processes": len(sruns),
        "srtr_mb": sum(rss_mb(p.pid) for p in ours),
        "srtr_processes": len(ours),
        "srun_mb": sum(rss_mb(p.pid) for p in sruns),
        "agents": len(agents),
        "agent_mb": agent_mb,
        "tagged_processes": len(procs),
    }


def secret_check(secret: str, marks: Path) -> dict[str, int]:
    """Where the secret is: command lines (must be none), the riders' environments (all)."""
    pids = {pid for pid, _ in read_marks(marks)}
    delivered = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            if f"HF_TOKEN={secret}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                delivered += 1
    return {
        "in_cmdlines": len(cmdlines_with(secret)) + len(cmdlines_with(secret[:12])),
        "delivered": delivered,
        "checked": len(pids),
    }


def kill_riders(marks: Path, kills: int) -> list[float]:
    """SIGKILL a random live `mark` rider `kills` times; kill → the new process's own mark."""
    live = {pid for pid, _ in read_marks(marks)}
    latencies = []
    for _ in range(kills):
        time.sleep(random.uniform(0.02, 0.06))
        seen = read_marks(marks)
        victim = random.choice(sorted(live))
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(now := read_marks(marks)) == len(seen):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no relaunch within 30s after killing pid {victim}")
            time.sleep(0.002)
        pid, when = now[len(seen)]
        latencies.append(when - t_kill)
        live = (live - {victim}) | {pid}
    return latencies


def sigterm_all_gone(job: Job, tag: str) -> dict[str, float]:
    pids = {p.pid for p in scan(tag)}
    t0 = time.time()
    job.proc.send_signal(signal.SIGTERM)
    remaining = set(pids)
    while remaining:
        remaining = {p for p in remaining if alive(p)}
        if time.time() - t0 > 120:
            raise TimeoutError(f"{len(remaining)} process(es) alive 120s after SIGTERM")
        time.sleep(0.02)
    gone = time.time() - t0
    job.proc.wait(60)
    deadline = time.monotonic() + 30
    while (left := scan(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)  # a process started during the stop (not in the snapshot)
    return {"gone_s": gone, "processes": len(pids), "leftovers": len(left)}


def main_job(ctx: Context, bench: Cluster, launcher: str, kills: int) -> dict[str, Any]:
    where = bench.work(ctx, f"slurm_scale/{launcher}")
    run = start(ctx, bench, launcher, where)
    job = run.job
    try:
        launched = [e["ts"] for e in job.events if e["reason"] == "Launched"]
        out: dict[str, Any] = {"up_s": max(launched) - job.started}
        time.sleep(2.0)  # let the launch burst's state.json writes and polls pass
        out.update(head_cost(job, run.tag))
        out["secret"] = secret_check(run.secret, run.marks)
        if out["secret"]["delivered"] != out["secret"]["checked"]:
            # Not in argv proves nothing unless the value did reach the instances.
            raise RuntimeError(f"{launcher}: the secret did not reach every rider: {out['secret']}")
        out["relaunch_ms"] = [x * 1000 for x in kill_riders(run.marks, kills)]
        out["teardown"] = sigterm_all_gone(job, run.tag)
    finally:
        job.kill()
    ctx.log(
        f"slurm_scale {launcher}: all Running {out['up_s']:.2f}s after `srtr up`; "
        f"srun {out['srun_processes']} ({out['srun_mb']:.0f} MB) + srtr {out['srtr_mb']:.0f} MB"
        f"; agents {out['agents']} (max {max(out['agent_mb'], default=0):.1f} MB); secret in "
        f"argv {out['secret']['in_cmdlines']}, delivered {out['secret']['delivered']}/"
        f"{out['secret']['checked']}; relaunch median {median(out['relaunch_ms']):.1f} ms p99 "
        f"{percentile(out['relaunch_ms'], 99):.1f} ms; SIGTERM → gone "
        f"{out['teardown']['gone_s']:.2f}s ({out['teardown']['processes']} processes)"
    )
    return out


def freeze_node(bench: Cluster, tag: str, node: str) -> tuple[float, list[int]]:
    """SIGSTOP everything of `node` at once: its slurmd, the job's processes there (found by
    SLURMD_NODENAME, which SLURM sets for every task) and their slurmstepd. Returns when the
    first signal was sent, and the frozen pids (`thaw_and_kill` ends them)."""
    procs = scan(tag)
    here = [p for p in procs if p.env("SLURMD_NODENAME") == node and not is_srun(p)]
    stepds = set()
    for p in here:
        with contextlib.suppress(OSError):
            parent = Path(f"/proc/{p.ppid}/cmdline").read_bytes()
            if parent.startswith(b"slurmstepd"):
                stepds.add(p.ppid)
    victims = [bench.slurmd_pid(node), *stepds, *(p.pid for p in here)]
    t0 = time.time()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return t0, victims


def thaw_and_kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


def node_loss(ctx: Context, bench: Cluster, launcher: str, timeout: float) -> dict[str, Any]:
    where = bench.work(ctx, f"slurm_scale/{launcher}-loss")
    run = start(ctx, bench, launcher, where)
    job = run.job
    frozen: list[int] = []
    cut = bench.separate_hosts()
    try:
        time.sleep(1.0)
        if cut:  # a dead switch port: the node and everything on it runs on, unheard
            t0 = time.time()
            bench.link(VICTIM_NODE, up=False)
        else:
            t0, frozen = freeze_node(bench, run.tag, VICTIM_NODE)
        try:
            lost = job.wait(lambda ev: job.first("NodeLost"), timeout=timeout, step=0.01)
            out: dict[str, Any] = {"lost_s": lost["ts"] - t0, "message": lost["message"]}
        except TimeoutError:
            out = {"lost_s": None, "message": f"no NodeLost within {timeout:g}s"}
        stopping = time.time()
        try:
            job.stop(timeout=60)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{launcher}: `srtr up` did not exit within 90s of SIGINT after losing "
                f"{VICTIM_NODE}; its output ends:\n{job.tail(30)}"
            ) from None
        out["stop_after_loss_s"] = time.time() - stopping
    finally:
        job.kill()
        thaw_and_kill(frozen)
        if cut:
            bench.link(VICTIM_NODE, up=True)
        bench.heal()
    how = "cut off" if cut else "frozen"
    ctx.log(f"slurm_scale {launcher}: node {VICTIM_NODE} {how} → NodeLost: {out}")
    return out


def run(ctx: Context) -> list[Figure]:
    bench = cluster(ctx, NODES)
    kills = 15 if ctx.quick else 60
    got: dict[str, dict[str, Any]] = {}
    for launcher in ("step", "agent"):
        got[launcher] = main_job(ctx, bench, launcher, kills)
        got[launcher]["loss"] = node_loss(ctx, bench, launcher, 30 if launcher == "agent" else 60)
    return figures(got, kills)


def figures(got: dict[str, dict[str, Any]], kills: int) -> list[Figure]:
    agent, step = got["agent"], got["step"]
    n = f"{NODES}×{PER_NODE}"
    label = "step launcher"

    def head(d: dict[str, Any]) -> float:
        return float(d["srtr_mb"] + d["srun_mb"])

    return [
        Figure("slurm_scale", f"{n} agent: all Running, from `srtr up`", agent["up_s"], "s",
               baseline=step["up_s"], baseline_label=label, note="salloc included",
               extra={"agent": agent, "step": step}),
        Figure("slurm_scale", f"{n} agent: srun processes on the head node",
               agent["srun_processes"], "", baseline=step["srun_processes"],
               baseline_label=label, target=4),
        Figure("slurm_scale", f"{n} agent: RSS of srtr + srun processes", head(agent), "MB",
               baseline=head(step), baseline_label=label, target=400,
               note=f"srtr {agent['srtr_mb']:.0f} MB + srun {agent['srun_mb']:.0f} MB"),
        Figure("slurm_scale", f"{n} agent: rider SIGKILL → relaunched (its own mark), median",
               median(agent["relaunch_ms"]), "ms", baseline=median(step["relaunch_ms"]),
               baseline_label=label, target=50, note=f"{kills} kills"),
        Figure("slurm_scale", f"{n} agent: rider SIGKILL → relaunched, p99",
               percentile(agent["relaunch_ms"], 99), "ms",
               baseline=percentile(step["relaunch_ms"], 99), baseline_label=label,
               note=f"{kills} kills; no target"),
        Figure("slurm_scale", f"{n} agent: SIGTERM → every process gone",
               agent["teardown"]["gone_s"], "s", baseline=step["teardown"]["gone_s"],
               baseline_label=label, target=10,
               note=f"{agent['teardown']['processes']} processes"),
        Figure("slurm_scale", f"{n} agent: the secret in any /proc/*/cmdline",
               agent["secret"]["in_cmdlines"], "", baseline=step["secret"]["in_cmdlines"],
               baseline_label=label, target=0,
               note=f"in the env of {agent['secret']['delivered']}/"
               f"{agent['secret']['checked']} riders"),
        Figure("slurm_scale", f"{n} agent: RSS of one agent (on its node), max of {NODES}",
               max(agent["agent_mb"], default=None), "MB", target=30,
               note=f"median {median(agent['agent_mb']):.1f} MB; {agent['agents']} agents"),
        Figure("slurm_scale", f"{n} agent: node dead → NodeLost", agent["loss"]["lost_s"], "s",
               baseline=step["loss"]["lost_s"], baseline_label=label + " (SLURM's node state)",
               target=3),
        Figure("slurm_scale", f"{n} agent: after the node loss, SIGINT → `srtr up` exited",
               agent["loss"].get("stop_after_loss_s"), "s",
               baseline=step["loss"].get("stop_after_loss_s"), baseline_label=label,
               note="no target; the agents' srun waits for the dead node's task"),
    ]  # fmt: skip
