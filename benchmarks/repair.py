"""Repair: SIGKILL a rider whose restart backoff is 0, 200 times; exit → new process runs.

The program is the helper's `mark` mode: on start it appends "PID EPOCH" to a file, then
sleeps until killed. The harness reads the pid, notes time.time(), sends SIGKILL, and waits
for the next line; the latency is the new line's own timestamp minus the kill time, so it
ends when the new process really runs (not when the manager says so), whatever the harness's
polling interval. srtr runs as users run it (`srtr up --headless`, local backend).

Baseline: supervisord (PyPI `supervisor`) with autorestart=true, startsecs=0, managing the
same program, killed the same way in the same run.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from benchmarks.common import (
    Context,
    Figure,
    Job,
    median,
    percentile,
    read_marks,
    write_yaml,
)
from benchmarks.supervisor import Supervisor

POLL = 0.002


def kill_loop(marks: Path, kills: int, settle: tuple[float, float]) -> list[float]:
    """Kill the newest marked process `kills` times; latencies in seconds."""
    deadline = time.monotonic() + 30
    while not read_marks(marks):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the first instance never marked {marks}")
        time.sleep(0.01)
    latencies = []
    for _ in range(kills):
        time.sleep(random.uniform(*settle))  # let the manager go idle again
        seen = read_marks(marks)
        pid = seen[-1][0]
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while True:
            now = read_marks(marks)
            if len(now) > len(seen):
                latencies.append(now[len(seen)][1] - t_kill)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no restart within 10s after killing pid {pid}")
            time.sleep(POLL)
    return latencies


def srtr_repair(ctx: Context, where: Path, kills: int) -> tuple[list[float], list[float]]:
    marks = where / "srtr.marks"
    path = write_yaml(
        where / "repair.yaml",
        {
            "name": "repair",
            "services": [
                {"name": "host", "command": ["sleep", "infinity"], "nodes": 1},
                {
                    "name": "victim",
                    "command": [ctx.helper, "mark", str(marks)],
                    "placement": {"pool": "host"},
                    "restart": {
                        "policy": "on-failure",
                        "backoff_seconds": 0,
                        "max_restarts": 1_000_000,
                    },
                },
            ],
        },
    )
    with Job(path, where / "run") as job:
        latencies = kill_loop(marks, kills, (0.02, 0.06))
        time.sleep(0.3)
        job.poll_events()
        job.stop()
    # srtr's own view: Exited event → the Launched event of the next attempt.
    internal = []
    exited_at = None
    for e in job.events:
        if e["object"] != "instance/service_victim":
            continue
        if e["reason"] == "Exited":
            exited_at = e["ts"]
        elif e["reason"] == "Launched" and exited_at is not None:
            internal.append(e["ts"] - exited_at)
            exited_at = None
    return latencies, internal


def supervisor_repair(ctx: Context, where: Path, kills: int) -> list[float]:
    marks = where / "supervisor.marks"
    with Supervisor(where / "supervisor", {"victim": f"{ctx.helper} mark {marks}"}) as sup:
        ctx.log(f"repair: supervisord settings: {sup.settings}")
        sup.wait_rpc()
        return kill_loop(marks, kills, (0.02, 0.06))


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("repair")
    kills = 40 if ctx.quick else 200
    ours, internal = srtr_repair(ctx, where, kills)
    ctx.log(
        f"repair: srtr median {median(ours) * 1000:.1f} ms, p99 {percentile(ours, 99) * 1000:.1f}"
        f" ms (events: Exited→Launched median {median(internal) * 1000:.1f} ms)"
    )
    theirs = supervisor_repair(ctx, where, kills)
    ctx.log(
        f"repair: supervisord median {median(theirs) * 1000:.1f} ms, "
        f"p99 {percentile(theirs, 99) * 1000:.1f} ms"
    )
    ms = 1000
    return [
        Figure(
            "repair",
            f"exit → new process runs, median of {kills}",
            median(ours) * ms,
            "ms",
            baseline=median(theirs) * ms,
            baseline_label="supervisord autorestart",
            target=50,
            extra={"srtr_ms": [x * ms for x in ours], "supervisord_ms": [x * ms for x in theirs]},
        ),
        Figure(
            "repair",
            f"exit → new process runs, p99 of {kills}",
            percentile(ours, 99) * ms,
            "ms",
            baseline=percentile(theirs, 99) * ms,
            baseline_label="supervisord autorestart",
        ),
        Figure(
            "repair",
            "Exited → Launched event (srtr's own view), median",
            median(internal) * ms,
            "ms",
            note=f"p99 {percentile(internal, 99) * ms:.1f} ms; ts resolution 1 ms",
        ),
    ]
