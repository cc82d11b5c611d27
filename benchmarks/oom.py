"""A kernel OOM kill → srtr's `OOMKilled` event.

Recipe: one service with `limits: {memory: 64Mi}` (a per-instance memory cgroup on the local
backend) running `health_programs.py hog`, which allocates and touches 4 MiB at a time and
appends "PID EPOCH" (its own clock) to a file after each block, until the kernel kills it.
`restart: never`, so one job is one kill; a few jobs give the median.

Figure: the hog's last mark (the kernel's kill comes within one block's allocation, well
under a millisecond, after it) → the first event of that instance that names `OOMKilled`
(srtr's own view, events.jsonl). The instance's `Exited` event → that event is in `extra`
(0 when one event carries both). Target ≤ 1 s.

Skipped, with srtr's own words, when `srtr plan` refuses the recipe (exit 2: no `limits` in
this srtr), or when srtr runs without the limit (no cgroup here: the hog reaches 512 MiB
and exits 3).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Figure, Job, Skip, median, read_marks, srtr_argv, write_yaml
from benchmarks.health import program

LIMIT = "64Mi"
TARGET = 1.0  # s


def recipe(path: Path, marks: Path) -> Path:
    svc = {
        "name": "hog",
        "command": program("hog", str(marks)),
        "limits": {"memory": LIMIT},
        "restart": {"policy": "never"},
    }
    return write_yaml(path, {"name": "oom", "services": [svc]})


def refused(path: Path) -> str | None:
    done = subprocess.run(
        [*srtr_argv(), "plan", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode == 2:
        first = (done.stderr or done.stdout).strip().splitlines()[0]
        return first.split("; allowed:")[0]  # not the list of every key
    return None


def one_kill(ctx: Context, where: Path, k: int) -> dict[str, Any]:
    marks = where / f"hog{k}.marks"
    path = recipe(where / f"oom{k}.yaml", marks)
    obj = "instance/service_hog"
    with Job(path, where / f"run{k}") as job:

        def classified(ev: list[dict[str, Any]]) -> Any:
            for e in ev:
                if e["object"] == obj and "OOMKilled" in (e["reason"] + e["message"]):
                    return e
            if any(e["object"] == obj and e["reason"] == "Exited" for e in ev):
                exited = next(e for e in ev if e["object"] == obj and e["reason"] == "Exited")
                if "code 3" in exited["message"]:
                    raise Skip(f"the hog allocated 512 MiB unharmed: no {LIMIT} limit took effect")
            return None

        oom = job.wait(classified, timeout=120, step=0.01)
        job.stop()
    last = read_marks(marks)[-1][1]
    # The exit and its class may be one event (`Exited` ... `(OOMKilled)`): then 0.
    exited = next((e for e in job.events if e["object"] == obj and e["reason"] == "Exited"), oom)
    return {
        "allocated_mib": 4 * len(read_marks(marks)),
        "last_mark_to_oomkilled_s": oom["ts"] - last,
        "last_mark_to_exited_s": exited["ts"] - last,
        "exited_to_oomkilled_s": oom["ts"] - exited["ts"],
        "event": {"reason": oom["reason"], "message": oom["message"]},
    }


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("oom")
    why = refused(recipe(where / "probe.yaml", where / "probe.marks"))
    if why is not None:
        raise Skip(f"srtr plan refuses `limits: {{memory: {LIMIT}}}` (exit 2): {why}")
    repeats = 2 if ctx.quick else 3
    kills = [one_kill(ctx, where, k) for k in range(repeats)]
    ctx.log(f"oom: {kills}")
    values = [k["last_mark_to_oomkilled_s"] for k in kills]
    return [
        Figure(
            "oom",
            f"kernel OOM kill ({LIMIT} limit) → OOMKilled event (median of {repeats})",
            median(values),
            "s",
            target=TARGET,
            note=f"Exited → OOMKilled {median(k['exited_to_oomkilled_s'] for k in kills):.3f}s",
            extra={"kills": kills, "python": sys.version.split()[0]},
        )
    ]
