"""Health (liveness probes and gang restarts) on the local backend.

Four parts, each one `srtr up --headless` job whose program misbehaves again on every attempt,
so one job gives several samples (medians; every sample in `extra`). Times are srtr's own
view (events.jsonl timestamps) unless a program's own mark is the only witness of the start:

- wedged: an HTTP server that accepts connections and never answers (wedged from its start,
  so from each Ready on), readiness a port probe, liveness an http probe: Ready → the next
  attempt Ready. Target: failure_threshold × (interval + timeout) + 1 s.
- silent: a program that prints a few lines, marks the time (its own clock) and SIGSTOPs
  itself, liveness `log: {silence_seconds: S}`, threshold 1, grace 0.5 s: its mark → the
  next attempt's `Launched`. Target: S + interval + 1 s. A stopped process stays stopped on
  SIGTERM (the signal waits for a SIGCONT), so srtr's stop takes the whole grace: the
  figure holds it.
- gang: a pool of 32 (`restart: {scope: pool}`, backoff 0, grace 1 s) of `sh` reading a FIFO
  of their own; the harness writes to one, which exits 1: its `Exited` → the 32nd `Launched`
  of the relaunch. Target: the grace + 1 s (the members exit on SIGTERM, so the grace is an
  upper bound they do not reach).
- probes: `srtr up --hollow`, 1,024 hollow nodes × 4 services, a liveness probe (exec) on
  every instance every 1 s (hollow agents simulate probes; their loops run in the hollow
  process, reporting only transitions): the controller's idle CPU over 10 s, 12 s after the
  last `Launched` (the watches going out and the last state.json writes are not idle). Baseline: the
  same job without probes, same run. One instance is then made to fail its probes (the
  hollow control line `unhealthy`) to show the loops run: → its `Unhealthy` (no target).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH,
    Context,
    Figure,
    Job,
    idle_sample,
    median,
    read_marks,
    write_yaml,
)
from benchmarks.hollow import control

PROGRAMS = str(BENCH / "health_programs.py")
PORT = 18761
GANG_GRACE = 1.0
SETTLE = 12.0  # s after the last Launched before the idle sample
SILENT_GRACE = 0.5  # s; a stopped process ignores SIGTERM, so this is part of the figure


def program(*args: str) -> list[str]:
    return [sys.executable, PROGRAMS, *args]


def times(job: Job, reason: str, obj: str) -> list[float]:
    return [e["ts"] for e in job.events if e["reason"] == reason and e["object"] == obj]


def restart(**more: Any) -> dict[str, Any]:
    return {"policy": "on-failure", "backoff_seconds": 0, "max_restarts": 1000, **more}


# --- a wedged server ------------------------------------------------------------------------------


def wedged(ctx: Context, where: Path, repeats: int) -> dict[str, Any]:
    interval, timeout, threshold = (0.5, 0.5, 2) if ctx.quick else (1.0, 1.0, 3)
    svc = {
        "name": "web",
        "command": program("wedged", "{node_ip}", str(PORT)),
        "readiness": {"port": PORT, "interval_seconds": 0.05},
        "liveness": {
            "http": {"port": PORT, "path": "/"},
            "interval_seconds": interval,
            "timeout_seconds": timeout,
            "failure_threshold": threshold,
        },
        "restart": restart(),
        "stop_grace_seconds": 1,
    }
    path = write_yaml(where / "wedged.yaml", {"name": "wedged", "services": [svc]})
    obj = "instance/service_web"
    with Job(path, where / "wedged-run") as job:
        job.wait(lambda ev: len(times(job, "Ready", obj)) > repeats, timeout=60 + 20 * repeats)
        job.stop()
    ready = times(job, "Ready", obj)[: repeats + 1]
    unhealthy, launched = times(job, "Unhealthy", obj), times(job, "Launched", obj)
    return {
        "settings": {"interval": interval, "timeout": timeout, "threshold": threshold},
        "target_s": threshold * (interval + timeout) + 1,
        "ready_to_ready_s": [b - a for a, b in itertools.pairwise(ready)],
        "ready_to_unhealthy_s": [u - r for r, u in zip(ready, unhealthy, strict=False)],
        "unhealthy_to_launched_s": [la - u for u, la in zip(unhealthy, launched[1:], strict=False)],
    }


# --- a silent (stopped) instance ------------------------------------------------------------------


def silent(ctx: Context, where: Path, repeats: int) -> dict[str, Any]:
    silence, interval = 2.0, 0.5
    marks = where / "silent.marks"
    svc = {
        "name": "quiet",
        "command": program("silent", str(marks)),
        "liveness": {
            "log": {"silence_seconds": silence},
            "interval_seconds": interval,
            "failure_threshold": 1,
        },
        "restart": restart(),
        "stop_grace_seconds": SILENT_GRACE,
    }
    path = write_yaml(where / "silent.yaml", {"name": "silent", "services": [svc]})
    obj = "instance/service_quiet"
    with Job(path, where / "silent-run") as job:
        job.wait(lambda ev: len(times(job, "Launched", obj)) > repeats, timeout=60 + 20 * repeats)
        job.stop()
    stopped = [at for _, at in read_marks(marks)][:repeats]
    launched = times(job, "Launched", obj)[1 : repeats + 1]
    unhealthy = times(job, "Unhealthy", obj)
    return {
        "settings": {"silence": silence, "interval": interval, "threshold": 1},
        "target_s": silence + interval + 1,
        "stop_to_launched_s": [la - s for s, la in zip(stopped, launched, strict=True)],
        "stop_to_unhealthy_s": [u - s for s, u in zip(stopped, unhealthy, strict=False)],
    }


# --- a gang restart of a pool of 32 ---------------------------------------------------------------


def gang_recipe(where: Path, nodes: int, grace: float) -> tuple[Path, Path]:
    """A pool of `sh` members, each blocked reading a FIFO of its own (`fifo{index}`, under
    `where`): a line written there makes that member exit 1. (The recipe, the FIFOs' dir.)"""
    fifos = where / "fifos"
    fifos.mkdir()
    for k in range(nodes):
        os.mkfifo(fifos / f"fifo{k}")
    svc = {
        "name": "gang",
        "nodes": nodes,
        "command": ["sh", "-c", f"read line < {fifos}/fifo{{index}}; exit 1"],
        "restart": restart(scope="pool"),
        "stop_grace_seconds": grace,
    }
    return write_yaml(where / "gang.yaml", {"name": "gang", "services": [svc]}), fifos


def gang(ctx: Context, where: Path, repeats: int) -> dict[str, Any]:
    nodes = 8 if ctx.quick else 32
    path, fifos = gang_recipe(where, nodes, GANG_GRACE)
    return gang_rounds(ctx, Job(path, where / "gang-run"), fifos, nodes, repeats)


def poke(fifo: Path, timeout: float = 10) -> float:
    """Write a line to a member's FIFO (once its `sh` has it open); when (time.time())."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet (the relaunched sh is still starting)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    try:
        at = time.time()
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
    return at


def gang_rounds(
    ctx: Context, job: Job, fifos: Path, nodes: int, repeats: int, grace: float = GANG_GRACE
) -> dict[str, Any]:
    """`repeats` times: one member exits 1; its Exited → the last of the pool's relaunches."""
    prefix = "instance/service_gang"
    out: dict[str, Any] = {"nodes": nodes, "grace_s": grace}
    samples: list[dict[str, float]] = []
    with job:
        job.wait(lambda ev: job.count("Launched", prefix) >= nodes, timeout=120)
        for r in range(repeats):
            time.sleep(0.3)  # the pool settles (every sh blocked in its FIFO's open)
            job.poll_events()
            seen = len(job.events)
            victim = (5 * r + 3) % nodes
            wrote = poke(fifos / f"fifo{victim}")

            def relaunched(ev: list[dict[str, Any]], seen: int = seen) -> bool:
                new = ev[seen:]
                return sum(e["reason"] == "Launched" for e in new) >= nodes

            job.wait(relaunched, timeout=60)
            new = job.events[seen:]
            exited = next(e for e in new if e["reason"] == "Exited")
            pool = next(e for e in new if e["reason"] == "PoolRestarting")
            last = max(e["ts"] for e in new if e["reason"] == "Launched")
            samples.append(
                {
                    "write_to_exited_s": exited["ts"] - wrote,
                    "exited_to_pool_restarting_s": pool["ts"] - exited["ts"],
                    "exited_to_all_launched_s": last - exited["ts"],
                    "victim": float(victim),
                }
            )
            ctx.log(f"gang round {r + 1}: {samples[-1]}")
        job.stop()
    out["rounds"] = samples
    return out


# --- probes on 4,096 hollow instances -------------------------------------------------------------


def hollow_recipe(path: Path, nodes: int, probes: bool) -> Path:
    names = ("base", "side1", "side2", "side3")
    services: list[dict[str, Any]] = []
    for name in names:
        svc: dict[str, Any] = {"name": name, "command": ["sleep", "infinity"]}
        svc.update({"nodes": nodes} if name == "base" else {"placement": {"pool": "base"}})
        if probes:
            svc["liveness"] = {"exec": {"command": ["true"]}, "interval_seconds": 1}
            svc["restart"] = restart()
        services.append(svc)
    return write_yaml(path, {"name": "hprobes" if probes else "hplain", "services": services})


def hollow_idle(ctx: Context, where: Path, probes: bool) -> dict[str, Any]:
    nodes, idle_s = (256, 5.0) if ctx.quick else (1024, 10.0)
    total = nodes * 4
    tag = "probes" if probes else "plain"
    path = hollow_recipe(where / f"hollow-{tag}.yaml", nodes, probes)
    out: dict[str, Any] = {"nodes": nodes, "instances": total}
    with Job(path, where / f"hollow-{tag}-run", extra=["--hollow"]) as job:
        out["all_launched_from_up_s"], _ = job.all_launched(total, timeout=300, step=0.1)
        # The first seconds after the launch are not idle: the last state.json writes, and
        # with probes the 4,096 watches going out (a 10 s sample right after 3 s of settling
        # read 2.2 % with probes and 1.4 % without; the next three 0.5-0.7 % for both).
        time.sleep(SETTLE)
        out["settle_s"] = SETTLE
        out["idle"] = idle_sample(job.pid, idle_s)
        if probes:
            obj = next(e["object"] for e in job.events if e["reason"] == "Launched")
            job.poll_events()
            seen = len(job.events)
            at = control(job, f"unhealthy {obj.removeprefix('instance/')}")

            def unhealthy(ev: list[dict[str, Any]]) -> Any:
                return next((e for e in ev[seen:] if e["reason"] == "Unhealthy"), None)

            out["unhealthy_object"] = obj
            out["control_to_unhealthy_s"] = job.wait(unhealthy, timeout=30)["ts"] - at
        job.stop(timeout=120)
    ctx.log(f"health: hollow {tag}: {out}")
    return out


# --- figures --------------------------------------------------------------------------------------


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("health")
    repeats = 2 if ctx.quick else 3
    w = wedged(ctx, where, repeats)
    ctx.log(f"health: wedged {w}")
    s = silent(ctx, where, repeats)
    ctx.log(f"health: silent {s}")
    g = gang(ctx, where, repeats)
    probed = hollow_idle(ctx, where, probes=True)
    plain = hollow_idle(ctx, where, probes=False)
    ws, ss = w["settings"], s["settings"]
    rounds = [x["exited_to_all_launched_s"] for x in g["rounds"]]
    n = probed["nodes"]
    return [
        Figure(
            "health",
            f"wedged http server → relaunched and Ready (liveness http every {ws['interval']:g}s,"
            f" timeout {ws['timeout']:g}s, threshold {ws['threshold']}; median of {repeats})",
            median(w["ready_to_ready_s"]),
            "s",
            target=w["target_s"],
            note=f"Ready → Unhealthy {median(w['ready_to_unhealthy_s']):.2f}s, "
            f"Unhealthy → Launched {median(w['unhealthy_to_launched_s']) * 1000:.0f} ms",
            extra=w,
        ),
        Figure(
            "health",
            f"SIGSTOPped instance → relaunched (log silence {ss['silence']:g}s, every "
            f"{ss['interval']:g}s; median of {repeats})",
            median(s["stop_to_launched_s"]),
            "s",
            target=s["target_s"],
            note=f"stop → Unhealthy {median(s['stop_to_unhealthy_s']):.2f}s; includes the grace "
            f"{SILENT_GRACE:g}s: a stopped process stays stopped on SIGTERM, dies at SIGKILL",
            extra=s,
        ),
        Figure(
            "health",
            f"pool of {g['nodes']}, one member exits 1 → all {g['nodes']} relaunched "
            f"(grace {GANG_GRACE:g}s; median of {repeats})",
            median(rounds),
            "s",
            target=GANG_GRACE + 1,
            note=f"max {max(rounds):.3f}s",
            extra=g,
        ),
        Figure(
            "health",
            f"{n} hollow nodes × 4, liveness every 1s on each: controller CPU while idle "
            f"({probed['idle']['seconds']:.0f}s)",
            probed["idle"]["cpu_percent"],
            "%",
            baseline=plain["idle"]["cpu_percent"],
            baseline_label="the same job without probes",
            target=1.0,
            note=f"% of one core; unhealthy → Unhealthy {probed['control_to_unhealthy_s']:.2f}s",
            extra={"probes": probed, "plain": plain},
        ),
    ]
