"""SLURM: fan-out and live edit on 16 nodes, and srtr's cost over a plain parallel srun loop.

The cluster is the project's one-machine test cluster (`scripts/slurm-cluster`), started for
the benchmark in its own directory and ports so that it does not disturb the 4-node cluster
the SLURM tests use (`/tmp/srtr-slurm`, slurmctld 6817, slurmd 17001+):

    SRTR_SLURM_DIR=/tmp/srtr-slurm-bench SRTR_SLURM_CTLD_PORT=6917 \
        scripts/slurm-cluster up --nodes 16

`scripts/slurm-cluster` writes slurmd ports 17000+K with no way to change the base, so two
clusters would collide on nodes 1-4. The harness therefore runs a copy of the script (in the
scratch dir) whose only change is `Port=$((${SRTR_SLURM_SLURMD_PORT_BASE:-17000} + k))`, with
base 18000. If that line ever changes shape, the harness falls back to the real script and
only runs when the test cluster is down. The benchmark cluster is always brought down at the
end.

One allocation (`salloc --no-shell -N16`) holds every measurement; `srtr up --backend slurm`
runs inside it (SLURM_JOB_ID / SLURM_JOB_NODELIST set, as in a batch script).

- Fan-out: a pool of 16, each instance ready 1 s after it starts (tcp probe every 0.05 s);
  figure = pool ready / single instance ready (PhaseStarted → PoolReady); target ≤ 1.5.
  Baseline: sequential srun launch-wait-next of the same program.
- Live edit: add a rider to the 16-node pool; save → the 16th rider runs (its own mark);
  target ≤ 3 s. Baseline: stop the job and start it edited.
- Overhead: 16 instances of the helper's `mark` (no probe) through srtr, from the stage's
  start to the 16th mark, against 16 `srun` (srtr's own flags) started at once from Python,
  from the first start to the 16th mark; target ratio ≤ 1.3.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks import fanout, live_edit
from benchmarks.common import (
    ROOT,
    Context,
    Figure,
    Job,
    median,
    wait_tcp,
    write_yaml,
)

NODES = 16
BENCH_DIR = "/tmp/srtr-slurm-bench"
CTLD_PORT = "6917"
SLURMD_BASE = "18000"
TEST_DIR = "/tmp/srtr-slurm"
PORT_LINE = "Port=$((17000 + k))"


class Skip(Exception):
    pass


class Cluster:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        script = (ROOT / "scripts" / "slurm-cluster").read_text(encoding="utf-8")
        self.env = {
            **os.environ,
            "SRTR_SLURM_DIR": BENCH_DIR,
            "SRTR_SLURM_CTLD_PORT": CTLD_PORT,
            "SRTR_SLURM_SLURMD_PORT_BASE": SLURMD_BASE,
        }
        self.env.pop("SLURM_CONF", None)
        self.env.pop("SLURM_JOB_ID", None)
        if PORT_LINE in script:
            patched = script.replace(
                PORT_LINE, "Port=$((${SRTR_SLURM_SLURMD_PORT_BASE:-17000} + k))"
            )
            self.script = ctx.scratch / "slurm-cluster"
            self.script.write_text(patched, encoding="utf-8")
            self.script.chmod(0o755)
            self.coexists = True
        else:
            self.script = ROOT / "scripts" / "slurm-cluster"
            self.coexists = False
        self.conf: str | None = None

    def test_cluster_running(self) -> bool:
        done = subprocess.run(
            [str(ROOT / "scripts" / "slurm-cluster"), "status", "--dir", TEST_DIR],
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
            check=False,
        )
        return done.returncode == 0

    def up(self) -> str:
        if not shutil.which("srun") and not shutil.which("apt-get"):
            raise Skip("no SLURM and no apt-get to install it")
        if not self.coexists and self.test_cluster_running():
            raise Skip(
                f"the test cluster in {TEST_DIR} is running and scripts/slurm-cluster has no "
                "slurmd port setting: two clusters would collide on ports 17001+"
            )
        done = subprocess.run(
            [str(self.script), "up", "--nodes", str(NODES)],
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
            timeout=300,
        )
        found = re.findall(r"export SLURM_CONF=(\S+)", done.stdout)
        if done.returncode != 0 or not found:
            raise RuntimeError(
                f"slurm-cluster up failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        self.conf = found[-1]
        return self.conf

    def down(self) -> None:
        subprocess.run(
            [str(self.script), "down"],
            capture_output=True,
            env=self.env,
            check=False,
            timeout=300,
        )


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
    with Job(path, where / "run", env=env, extra=["--backend", "slurm"]) as job:
        last = live_edit.wait_marks(marks, NODES, 120)
        stage = job.wait(lambda ev: job.first("PhaseStarted", contains="stage 1/"), timeout=10)
        job.stop()
    return {"from_stage": last - stage["ts"], "from_up": last - job.started}


def sequential_sruns(ctx: Context, where: Path, env: dict[str, str], job: str) -> dict[str, float]:
    procs = []
    each = []
    t0 = time.time()
    try:
        for k in range(1, NODES + 1):
            ip = f"127.0.0.{k + 1}"
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


def measure(ctx: Context, env: dict[str, str], job: str) -> list[Figure]:
    repeats = 1 if ctx.quick else 3
    args = ["--backend", "slurm"]
    # -- fan-out ------------------------------------------------------------------------------
    where = ctx.dir("slurm/fanout")
    singles, pools = [], []
    for _ in range(repeats):
        singles.append(fanout.pool_ready_time(ctx, where, 1, env, args)["ready"])
        pools.append(fanout.pool_ready_time(ctx, where, NODES, env, args)["ready"])
        ctx.log(f"slurm fanout: single {singles[-1]:.3f}s, pool of {NODES} {pools[-1]:.3f}s")
    seq = sequential_sruns(ctx, where, env, job)
    ctx.log(f"slurm fanout: sequential srun baseline {seq['total']:.2f}s")
    # -- live edit ----------------------------------------------------------------------------
    edits, restarts, applied = [], [], []
    for k in range(repeats):
        got = live_edit.run_edit(
            ctx, ctx.dir(f"slurm/live_edit/{k}"), NODES, env=env, extra=args, baseline=k == 0
        )
        edits.append(got["edit_s"])
        applied.append(got["applied_s"])
        if "restart_s" in got:
            restarts.append(got["restart_s"])
    # -- overhead -----------------------------------------------------------------------------
    ours, theirs, ours_up = [], [], []
    for k in range(repeats):
        where = ctx.dir(f"slurm/overhead/{k}")
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
            note=f"from the stage's start; {median(ours_up):.2f}s from `srtr up` starting",
            extra={"srtr_s": ours, "srtr_from_up_s": ours_up, "plain_s": theirs},
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    cluster = Cluster(ctx)
    try:
        conf = cluster.up()
    except Skip as exc:
        ctx.log(f"slurm: skipped: {exc}")
        return [Figure("slurm", f"skipped: {exc}", None, "")]
    ctx.log(
        f"slurm: {NODES}-node cluster in {BENCH_DIR} (slurmctld {CTLD_PORT}, slurmd "
        f"{SLURMD_BASE}+K; coexists with {TEST_DIR}: {cluster.coexists})"
    )
    env = slurm_env(conf)
    job = None
    try:
        job, nodelist = allocate(env)
        env = {**env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
        return measure(ctx, env, job)
    finally:
        if job is not None:
            subprocess.run(["scancel", job], env=slurm_env(conf), capture_output=True, check=False)
        cluster.down()
