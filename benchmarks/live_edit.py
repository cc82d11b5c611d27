"""Live edit: add a rider to a 64-node pool; time from saving the recipe until all 64 run.

srtr runs as users run it (`srtr up --headless`, which applies edits at once); the harness
saves the edited recipe the way editors do (write a temp file, rename it over the recipe)
and notes time.time() just before. The rider is the helper's `mark` mode, which appends
"PID EPOCH" to a file as its first act, so "runs" means the process really executes.
Figure: the 64th mark minus the save time. Target ≤ 1 s (local).

Baseline: what a job without live edits needs for the same change: stop the job (Ctrl+C)
and start it again with the edited recipe, until all 64 riders run.

`run_edit` is shared with the SLURM scenario (16 nodes there, target ≤ 3 s).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Context, Figure, Job, median, read_marks, save_atomic, write_yaml


def recipes(ctx: Context, nodes: int, marks: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    before = {
        "name": "live",
        "services": [{"name": "fleet", "command": ["sleep", "infinity"], "nodes": nodes}],
    }
    after = {
        "name": "live",
        "services": [
            *before["services"],
            {
                "name": "agent",
                "command": [ctx.helper, "mark", str(marks)],
                "placement": {"pool": "fleet"},
            },
        ],
    }
    return before, after


def wait_marks(path: Path, count: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        marks = read_marks(path)
        if len(marks) >= count:
            return max(t for _, t in marks[:count])
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(marks)} of {count} riders ran within {timeout}s")
        time.sleep(0.005)


def run_edit(
    ctx: Context,
    where: Path,
    nodes: int,
    *,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
    baseline: bool = True,
) -> dict[str, Any]:
    """One live edit (and, with `baseline`, the stop-and-restart alternative)."""
    marks = where / "edit.marks"
    before, after = recipes(ctx, nodes, marks)
    path = write_yaml(where / "live.yaml", before)
    out: dict[str, Any] = {}
    with Job(path, where / "run", env=env, extra=extra) as job:
        job.wait(lambda ev: job.count("Launched") >= nodes, timeout=120)
        time.sleep(1.0)  # let the job settle: every owner up, state written
        t_save = time.time()
        save_atomic(path, yaml.safe_dump(after, sort_keys=False))
        last = wait_marks(marks, nodes, 60)
        out["edit_s"] = last - t_save
        applied = job.wait(lambda ev: job.first("RecipeApplied"), timeout=10)
        out["applied_s"] = applied["ts"] - t_save
        job.stop()
    ctx.log(
        f"live edit: {nodes} riders run {out['edit_s']:.3f}s after the save "
        f"(RecipeApplied after {out['applied_s']:.3f}s)"
    )
    if baseline:
        restart_marks = where / "restart.marks"
        before2, after2 = recipes(ctx, nodes, restart_marks)
        path2 = write_yaml(where / "restart-before.yaml", before2)
        with Job(path2, where / "run-restart-1", env=env, extra=extra) as job:
            job.wait(lambda ev: job.count("Launched") >= nodes, timeout=120)
            time.sleep(1.0)
            t0 = time.time()
            job.stop()
        path3 = write_yaml(where / "restart-after.yaml", after2)
        with Job(path3, where / "run-restart-2", env=env, extra=extra):
            last = wait_marks(restart_marks, nodes, 120)
        out["restart_s"] = last - t0
        ctx.log(f"live edit: baseline stop + start with the edit: {out['restart_s']:.3f}s")
    return out


def run(ctx: Context) -> list[Figure]:
    nodes = 16 if ctx.quick else 64
    repeats = 1 if ctx.quick else 3
    edits, applied, restarts = [], [], []
    for k in range(repeats):
        got = run_edit(ctx, ctx.dir(f"live_edit/{k}"), nodes, baseline=k == 0)
        edits.append(got["edit_s"])
        applied.append(got["applied_s"])
        if "restart_s" in got:
            restarts.append(got["restart_s"])
    return [
        Figure(
            "live_edit",
            f"local: add a rider to a {nodes}-node pool → all {nodes} run",
            median(edits),
            "s",
            baseline=median(restarts),
            baseline_label="stop the job, start it edited",
            target=1.0,
            note=f"median of {repeats}; RecipeApplied after {median(applied):.3f}s",
            extra={"edit_s": edits, "applied_s": applied, "restart_s": restarts},
        )
    ]
