"""Fan-out: how fast a pool of 32 instances becomes ready, each ready 1 s after it starts.

srtr runs as a user runs it (`srtr up --headless`, local backend); times come from
events.jsonl: the stage's `PhaseStarted` to the pool's `PoolReady`. The same recipe with a
one-node pool gives the single-instance ready time. Figure = pool / single; target ≤ 1.2.

Baseline: the older system's sequential launch, emulated by the harness: start one instance,
probe it every 0.05 s until it accepts, then the next. Its figure is the same quotient.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from benchmarks.common import Context, Figure, Job, median, wait_tcp, write_yaml

PORT = 8700
INTERVAL = 0.05
DELAY = 1.0


def recipe(ctx: Context, path: Path, nodes: int) -> Path:
    return write_yaml(
        path,
        {
            "name": f"fanout{nodes}",
            "services": [
                {
                    "name": "web",
                    "command": [ctx.helper, "listen", "{node_ip}", str(PORT), str(DELAY)],
                    "nodes": nodes,
                    "readiness": {
                        "port": PORT,
                        "interval_seconds": INTERVAL,
                        "timeout_seconds": 60,
                    },
                }
            ],
        },
    )


def pool_ready_time(
    ctx: Context,
    where: Path,
    nodes: int,
    extra_env: dict | None = None,
    extra_args: list[str] | None = None,
) -> dict[str, float]:
    """Run the pool once; seconds from the stage's start to PoolReady (and launch spread)."""
    path = recipe(ctx, where / f"fanout{nodes}.yaml", nodes)
    run_dir = where / f"run-{nodes}-{time.monotonic_ns()}"
    with Job(path, run_dir, env=extra_env, extra=extra_args) as job:
        ready = job.wait(lambda ev: job.first("PoolReady", obj="pool/web"), timeout=120)
        stage = job.first("PhaseStarted", contains="stage 1/")
        launched = [e["ts"] for e in job.events if e["reason"] == "Launched"]
        job.stop()
    assert stage is not None
    return {
        "ready": ready["ts"] - stage["ts"],
        "launch_spread": max(launched) - stage["ts"],
        "from_process_start": ready["ts"] - job.started,
    }


def sequential(ctx: Context, nodes: int) -> dict[str, float]:
    """Launch one, wait until it is ready (tcp probe every INTERVAL), then the next."""
    procs = []
    ready_each = []
    t0 = time.time()
    try:
        for k in range(1, nodes + 1):
            ip = f"127.0.0.{k + 1}"
            started = time.time()
            procs.append(
                subprocess.Popen(
                    [ctx.helper, "listen", ip, str(PORT), str(DELAY)],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            done = wait_tcp(ip, PORT, INTERVAL, 30)
            ready_each.append(done - started)
        total = time.time() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {"total": total, "single": median(ready_each)}


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("fanout")
    nodes = 8 if ctx.quick else 32
    repeats = 1 if ctx.quick else 3
    singles, pools, spreads = [], [], []
    for _ in range(repeats):
        singles.append(pool_ready_time(ctx, where, 1)["ready"])
        got = pool_ready_time(ctx, where, nodes)
        pools.append(got["ready"])
        spreads.append(got["launch_spread"])
        ctx.log(
            f"fanout: single {singles[-1]:.3f}s, pool of {nodes} {pools[-1]:.3f}s "
            f"(launches spread over {spreads[-1]:.3f}s)"
        )
    single, pool = median(singles), median(pools)
    seq = sequential(ctx, nodes)
    ctx.log(f"fanout: sequential baseline {seq['total']:.2f}s (single {seq['single']:.3f}s)")
    return [
        Figure(
            "fanout",
            f"local: pool of {nodes} ready / 1 instance ready",
            pool / single,
            "x",
            baseline=seq["total"] / seq["single"],
            baseline_label="sequential launch-wait-next",
            target=1.2,
            extra={
                "single_ready_s": singles,
                "pool_ready_s": pools,
                "launch_spread_s": spreads,
                "sequential_total_s": seq["total"],
                "sequential_single_s": seq["single"],
                "nodes": nodes,
                "probe_interval_s": INTERVAL,
            },
        ),
        Figure(
            "fanout",
            f"local: pool of {nodes} time to ready",
            pool,
            "s",
            baseline=seq["total"],
            baseline_label="sequential launch-wait-next",
            note=f"launches spread over {median(spreads):.3f}s",
        ),
    ]
