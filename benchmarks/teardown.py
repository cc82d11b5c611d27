"""Teardown: 4,096 instances in tiers 0 and 1; time from Ctrl+C until every instance is gone.

Recipe: pool `front` (512 nodes, tier 0) with 3 riders, all `sleep infinity` (they die on
SIGTERM); pool `back` (512 nodes, `shutdown_tier: 1`) with 3 riders (riders inherit their
owner's tier), all the helper's `hold` mode, which ignores SIGTERM, so tier 1 needs the
SIGKILL after `stop_grace_seconds` (GRACE). 1,024 nodes × 4 services = 4,096 instances.

srtr runs as users run it (`srtr up --headless`, local backend); the harness sends SIGINT to
the controller (what Ctrl+C does) and polls /proc for every instance pid (from state.json)
until none is left (gone or a zombie), then waits for the controller to exit.
Target: ≤ GRACE + 3 s.

Baseline: supervisord stopping 4,096 `sleep` programs in one `[group:]` (so one main-loop pass
stops them all; SIGTERM to supervisord), measured by
the scale scenario when it ran in the same invocation, else here with the same programs.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Figure, Job, alive, write_yaml
from benchmarks.scale import supervisor_scale

GRACE = 3.0


def recipe(ctx: Context, path: Path, half: int) -> Path:
    services: list[dict[str, Any]] = []
    for pool, tier, command in (
        ("front", 0, ["sleep", "infinity"]),
        ("back", 1, [ctx.helper, "hold"]),
    ):
        services.append(
            {
                "name": pool,
                "command": command,
                "nodes": half,
                "shutdown_tier": tier,
                "stop_grace_seconds": GRACE,
            }
        )
        for k in range(1, 4):
            services.append(
                {
                    "name": f"{pool}side{k}",
                    "command": command,
                    "placement": {"pool": pool},
                    "stop_grace_seconds": GRACE,
                }
            )
    return write_yaml(path, {"name": "teardown", "services": services})


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("teardown")
    half = 128 if ctx.quick else 512
    total = half * 2 * 4
    path = recipe(ctx, where / "teardown.yaml", half)
    with Job(path, where / "run") as job:
        job.wait(lambda ev: job.count("Launched") >= total, timeout=900, step=0.2)
        time.sleep(1.0)
        state = job.state()
        pids = {i["pid"] for i in state["instances"] if i["pid"]}
        tiers = {i["shutdown_tier"] for i in state["instances"]}
        assert len(pids) == total, f"{len(pids)} pids in state.json, want {total}"
        t0 = time.time()
        job.proc.send_signal(signal.SIGINT)
        remaining = set(pids)
        while remaining:
            remaining = {p for p in remaining if alive(p)}
            if time.time() - t0 > 120:
                raise TimeoutError(f"{len(remaining)} instance(s) still alive 120s after SIGINT")
            time.sleep(0.02)
        gone = time.time() - t0
        job.proc.wait(120)
        exited = time.time() - t0
        job.poll_events()
        code = job.proc.returncode
    ctx.log(
        f"teardown: {total} instances in tiers {sorted(tiers)} gone {gone:.2f}s after SIGINT; "
        f"controller exited after {exited:.2f}s (exit {code})"
    )
    killed = job.first("TearingDown", contains="tier 1")
    first = job.first("TearingDown", contains="tier 0")
    tier0 = (killed["ts"] - first["ts"]) if killed and first else None
    base = ctx.shared.get("supervisord_scale")
    if base is None or base["instances"] != total:
        base = supervisor_scale(ctx, where)
    return [
        Figure(
            "teardown",
            f"{total} instances, tiers 0+1: Ctrl+C → all gone (grace {GRACE:g}s)",
            gone,
            "s",
            baseline=base["stop_all_s"],
            baseline_label="supervisord stop, one [group:] (no tiers, no grace used)",
            target=GRACE + 3,
            note=f"tier 0 drained in {tier0:.2f}s; controller exited at {exited:.2f}s"
            if tier0 is not None
            else f"controller exited at {exited:.2f}s",
            extra={
                "controller_exit_s": exited,
                "tier0_drain_s": tier0,
                "exit_code": code,
                "supervisord_settings": base.get("settings"),
            },
        )
    ]
