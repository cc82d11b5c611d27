"""SLURM: `srtr status RUN` from another host (issue 22), on the separate-hosts cluster.

A 4-node job (a pool of `sleep` plus a rider) runs with its controller on the host (`srtr up
--backend slurm`, which allocates); `srtr status RUN_DIR` then runs on node3, in that node's
namespaces (its own network stack, hostname and /tmp; the run dir is on storage every node
sees), REPEATS times one after another. The figure is the median wall time of one whole
`python3 -m srtr status` process, interpreter start included, as a user on that host waits
for it; target 0.5 s. Baseline: the same command on the controller's own host. Each run must
print the job's `phase=Running`, or the timing would be of an error.

What `srtr status` does from another host is the control work of issue 22 (heartbeat
liveness over a channel every host reaches); this scenario times whatever is there.
"""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.common import Context, Figure, Job, Skip, median, write_yaml
from benchmarks.slurm_cluster import cluster

NODES = 4
OTHER = "node3"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=60)
    took = time.perf_counter() - t0
    if "phase=Running" not in done.stdout:
        raise RuntimeError(f"{' '.join(argv)} did not see the job: {done.stdout}{done.stderr}")
    return took, done.stdout


def run(ctx: Context) -> list[Figure]:
    bench = cluster(ctx)
    if not bench.separate_hosts():
        raise Skip("the SLURM cluster's nodes share one network: there is no other host")
    repeats = 5 if ctx.quick else 20
    where = bench.work(ctx, "slurm_status")
    recipe = write_yaml(
        where / "status.yaml",
        {
            "name": "status",
            "services": [
                {"name": "pool", "command": ["sleep", "1000"], "nodes": NODES},
                {"name": "rider", "command": ["sleep", "1000"], "placement": {"pool": "pool"}},
            ],
        },
    )
    env = {k: v for k, v in bench.env.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = bench.conf
    run_dir = where / "run"
    with Job(recipe, run_dir, extra=["--backend", "slurm"], env=env, inherit_env=False) as job:
        job.wait(lambda ev: job.first("Converged"), timeout=120)
        # status reads state.json, which is written after the event (paced; at load 9 in
        # a full run it still said Launching when the first status ran).
        job.wait(lambda ev: job.state()["job"]["phase"] == "Running", timeout=60)
        status = [sys.executable, "-m", "srtr", "status", str(run_dir)]
        there, here = [], []
        first = ""
        for _ in range(repeats):
            took, said = timed(bench.on_node(OTHER, status), env)
            there.append(took)
            first = first or said.splitlines()[0]
            here.append(timed(status, env)[0])
        job.stop()
    ctx.log(
        f"slurm_status: `srtr status` on {OTHER} median {median(there) * 1000:.0f} ms, on the "
        f"controller's host {median(here) * 1000:.0f} ms; {OTHER} saw: {first}"
    )
    return [
        Figure(
            "slurm_status",
            f"`srtr status RUN` from another host ({OTHER}), median",
            median(there),
            "s",
            baseline=median(here),
            baseline_label="on the controller's host",
            target=0.5,
            note=f"{repeats} runs; one whole process each, Python start included",
            extra={"there_s": there, "here_s": here, "first_line": first},
        )
    ]
