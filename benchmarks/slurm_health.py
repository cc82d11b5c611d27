"""A gang restart on SLURM: a pool of 16 separate-host nodes, one member exits 1 → all 16
relaunched.

The benchmark cluster (`benchmarks.slurm_cluster`: every node its own network namespace,
hostname and /tmp), `srtr up --backend slurm --nodes 16` from the host (srtr's own salloc;
the default launcher, the node agent). The recipe is the local `health` scenario's gang:
a pool of 16 `sh`, `restart: {policy: on-failure, scope: pool, backoff_seconds: 0}`, grace
1 s, each member blocked reading a FIFO of its own under the cluster dir (which every node
sees); the harness writes a line to one, which exits 1. Figure: its `Exited` → the 16th
`Launched` of the relaunch (srtr's own view, events.jsonl), median of 3. Target: the grace
+ 2 s (the members exit on SIGTERM, so the grace is an upper bound they do not reach).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

from benchmarks.common import Context, Figure, Job, median
from benchmarks.health import gang_recipe, gang_rounds
from benchmarks.slurm_cluster import Cluster, cluster

NODES = 16
GRACE = 1.0


def idle_nodes(bench: Cluster) -> int:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"],
        capture_output=True,
        text=True,
        env=bench.env,
        check=False,
    )
    return len(set(done.stdout.split()))


def run(ctx: Context) -> list[Figure]:
    bench = cluster(ctx)
    nodes = min(NODES, bench.nodes)
    repeats = 2 if ctx.quick else 3
    deadline = time.monotonic() + 120
    while idle_nodes(bench) < nodes:  # the last scenario's allocation is being released
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {nodes} idle nodes after 120s")
        time.sleep(0.2)
    where = bench.work(ctx, f"health-{uuid.uuid4().hex[:6]}")
    path, fifos = gang_recipe(where, nodes, GRACE)
    job = Job(
        path,
        where / "run",
        nodes=nodes,
        extra=["--backend", "slurm"],
        env=bench.env,
        inherit_env=False,
    )
    out: dict[str, Any] = gang_rounds(ctx, job, fifos, nodes, repeats, grace=GRACE)
    out["launcher"] = job.state()["job"].get("launcher") if job.run_dir.exists() else None
    out["hosts"] = "separate hosts" if bench.separate_hosts() else "one shared network"
    ctx.log(f"slurm_health: {out}")
    rounds = [x["exited_to_all_launched_s"] for x in out["rounds"]]
    return [
        Figure(
            "slurm_health",
            f"SLURM, pool of {nodes} ({out['hosts']}), one member exits 1 → all {nodes} "
            f"relaunched (grace {GRACE:g}s; median of {repeats})",
            median(rounds),
            "s",
            target=GRACE + 2,
            note=f"max {max(rounds):.3f}s; launcher {out['launcher']}; {bench.describe()}",
            extra=out,
        )
    ]
