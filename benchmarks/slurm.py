"""SLURM: fan-out and live edit on 16 nodes, and srtr's cost over a plain parallel srun loop.

The cluster is the project's one-machine test cluster (`scripts/slurm-cluster`), whose nodes
are separate hosts, in the directory and ports `benchmarks.slurm_cluster` chooses from
SRTR_SLURM_DIR, SRTR_SLURM_CTLD_PORT and SRTR_SLURM_SLURMD_PORT_BASE (defaults:
/var/tmp/srtr-slurm-bench, 6917, 18000), so it runs next to the test cluster
(`/var/tmp/srtr-slurm`, 6817). It has 32 nodes (the 32-node scenario shares it); this
scenario allocates 16 of them. Run dirs live under the cluster dir, which every node sees.

One allocation (`salloc --no-shell -N16`) holds every measurement; `srtr up --backend slurm`
runs inside it (SLURM_JOB_ID / SLURM_JOB_NODELIST set, as in a batch script).

- Fan-out: a pool of 16, each instance ready 1 s after it starts (tcp probe every 0.05 s);
  figure = pool ready / single instance ready (PhaseStarted → PoolReady); target ≤ 1.5.
  Baseline: sequential srun launch-wait-next of the same program.
- Live edit: add a rider to the 16-node pool; save → the 16th rider runs (its own mark);
  target ≤ 3 s. Baseline: stop the job and start it edited.
- Overhead: 16 instances of the helper's `mark` (no probe) through srtr until the 16th mark,
  against 16 `srun` (srtr's own flags) started at once from Python, from the first start to
  the 16th mark. Two figures: srtr timed from its stage's start (`PhaseStarted`, target ratio
  ≤ 1.3) and from `srtr up` starting (Python, imports, planning included; no target, printed
  because it is what a user waits for).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path

from benchmarks import fanout, live_edit
from benchmarks.common import (
    Context,
    Figure,
    Job,
    median,
    wait_tcp,
    write_yaml,
)
from benchmarks.slurm_cluster import Cluster, cluster

NODES = 16


def slurm_env(conf: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = conf
    return env


def allocate(env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run(
        ["salloc", "--no-shell", "--no-kill", "--exclusive", f"-N{NODES}", "-J", "srtr-bench"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    match = re.search(r"Granted job allocation (\d+)", done.stderr)
    if not match:
        raise RuntimeError(f"salloc failed: {done.stderr}")
    job = match.group(1)
    nodelist = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    return job, nodelist


def srun_argv(job: str, node: str, name: str, log: Path, argv: list[str]) -> list[str]:
    """The same srun flags srtr's backend uses (slurm_cmd.srun_argv)."""
    return [
        "srun", "--jobid", job, "--overlap", "-N1", "-n1", "-w", node,
        f"--job-name={name}", f"--output={log}", "--open-mode=append", "--input=none",
        "--export=ALL", "env", "--", f"SRTR_INSTANCE={name}", *argv,
    ]  # fmt: skip


def scancel_steps(env: dict[str, str], job: str) -> None:
    steps = subprocess.run(
        ["squeue", "--steps", "-h", "-j", job, "-o", "%i"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    ).stdout.split()
    for step in steps:
        if "." in step and not step.endswith((".batch", ".extern", ".interactive")):
            subprocess.run(
                ["scancel", "--ctld", "--signal=KILL", "--full", step],
                env=env,
                capture_output=True,
                check=False,
            )


def plain_sruns(ctx: Context, where: Path, env: dict[str, str], job: str) -> float:
    marks = where / "plain.marks"
    procs = []
    t0 = time.time()
    try:
        for k in range(1, NODES + 1):
            procs.append(
                subprocess.Popen(
                    srun_argv(
                        job,
                        f"node{k}",
                        f"plain{k}",
                        where / f"plain{k}.log",
                        [ctx.helper, "mark", str(marks)],
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
        last = live_edit.wait_marks(marks, NODES, 60)
        return last - t0
    finally:
        scancel_steps(env, job)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)
            if p.poll() is None:
                p.kill()
                p.wait()


def srtr_marks(ctx: Context, where: Path, env: dict[str, str]) -> dict[str, float]:
    marks = where / "srtr.marks"
    path = write_yaml(
        where / "overhead.yaml",
        {
            "name": "overhead",
            "services": [
                {"name": "m", "command": [ctx.helper, "mark", str(marks)], "nodes": NODES}
            ],
        },
    )
    # One srun step per instance, as the baseline's 16 sruns: the node agents (the default
    # on SLURM) start their own steps first, which is not what this figure compares.
    extra = ["--backend", "slurm", "--launcher", "step"]
    with Job(path, where / "run", env=env, extra=extra) as job:
        last = live_edit.wait_marks(marks, NODES, 120)
        stage = job.wait(lambda ev: job.first("PhaseStarted", contains="stage 1/"), timeout=10)
        job.stop()
    return {"from_stage": last - stage["ts"], "from_up": last - job.started}


def sequential_sruns(
    ctx: Context, where: Path, env: dict[str, str], job: str, bench: Cluster
) -> dict[str, float]:
    procs = []
    each = []
    t0 = time.time()
    try:
        for k in range(1, NODES + 1):
            ip = bench.node_ip(f"node{k}")
            started = time.time()
            procs.append(
                subprocess.Popen(
                    srun_argv(
                        job,
                        f"node{k}",
                        f"seq{k}",
                        where / f"seq{k}.log",
                        [ctx.helper, "listen", ip, str(fanout.PORT), str(fanout.DELAY)],
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
            each.append(wait_tcp(ip, fanout.PORT, fanout.INTERVAL, 60) - started)
        total = time.time() - t0
    finally:
        scancel_steps(env, job)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"total": total, "single": median(each)}


def measure(ctx: Context, env: dict[str, str], job: str, bench: Cluster) -> list[Figure]:
    repeats = 1 if ctx.quick else 3
    args = ["--backend", "slurm"]
    # -- fan-out ------------------------------------------------------------------------------
    where = bench.work(ctx, "slurm/fanout")
    singles, pools = [], []
    for _ in range(repeats):
        singles.append(fanout.pool_ready_time(ctx, where, 1, env, args)["ready"])
        pools.append(fanout.pool_ready_time(ctx, where, NODES, env, args)["ready"])
        ctx.log(f"slurm fanout: single {singles[-1]:.3f}s, pool of {NODES} {pools[-1]:.3f}s")
    seq = sequential_sruns(ctx, where, env, job, bench)
    ctx.log(f"slurm fanout: sequential srun baseline {seq['total']:.2f}s")
    # -- live edit ----------------------------------------------------------------------------
    edits, restarts, applied = [], [], []
    for k in range(repeats):
        got = live_edit.run_edit(
            ctx,
            bench.work(ctx, f"slurm/live_edit/{k}"),
            NODES,
            env=env,
            extra=args,
            baseline=k == 0,
        )
        edits.append(got["edit_s"])
        applied.append(got["applied_s"])
        if "restart_s" in got:
            restarts.append(got["restart_s"])
    # -- overhead -----------------------------------------------------------------------------
    ours, theirs, ours_up = [], [], []
    for k in range(repeats):
        where = bench.work(ctx, f"slurm/overhead/{k}")
        got = srtr_marks(ctx, where, env)
        ours.append(got["from_stage"])
        ours_up.append(got["from_up"])
        theirs.append(plain_sruns(ctx, where, env, job))
        ctx.log(
            f"slurm overhead: srtr {ours[-1]:.3f}s from the stage's start "
            f"({ours_up[-1]:.3f}s from `srtr up`), plain srun loop {theirs[-1]:.3f}s"
        )
    single, pool = median(singles), median(pools)
    return [
        Figure(
            "slurm",
            f"SLURM: pool of {NODES} ready / 1 instance ready",
            pool / single,
            "x",
            baseline=seq["total"] / seq["single"],
            baseline_label="sequential srun launch-wait-next",
            target=1.5,
            extra={"single_s": singles, "pool_s": pools, "sequential": seq},
        ),
        Figure(
            "slurm",
            f"SLURM: add a rider to a {NODES}-node pool → all {NODES} run",
            median(edits),
            "s",
            baseline=median(restarts),
            baseline_label="stop the job, start it edited",
            target=3.0,
            note=f"median of {repeats}; RecipeApplied after {median(applied):.3f}s",
            extra={"edit_s": edits, "restart_s": restarts, "applied_s": applied},
        ),
        Figure(
            "slurm",
            f"SLURM: {NODES} instances through srtr vs a parallel srun loop",
            median(ours),
            "s",
            baseline=median(theirs),
            baseline_label="16 srun at once, same allocation",
            target=1.3,
            target_on="ratio",
            note="timed from the stage's PhaseStarted; --launcher step",
            extra={"srtr_s": ours, "srtr_from_up_s": ours_up, "plain_s": theirs},
        ),
        Figure(
            "slurm",
            f"SLURM: {NODES} instances through srtr vs a parallel srun loop, from `srtr up`",
            median(ours_up),
            "s",
            baseline=median(theirs),
            baseline_label="16 srun at once, same allocation",
            note="Python, imports and planning included; no target",
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    bench = cluster(ctx)
    env = slurm_env(bench.conf)
    job = None
    try:
        job, nodelist = allocate(env)
        env = {**env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
        return measure(ctx, env, job, bench)
    finally:
        if job is not None:
            subprocess.run(["scancel", job], env=slurm_env(bench.conf), capture_output=True)
