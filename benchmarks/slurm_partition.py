"""A node's link goes down (issue 22): the lease, the fence, the replacement, the teardown.

Needs the separate-hosts test cluster (`scripts/slurm-cluster up`, every node its own network
namespace; `scripts/slurm-cluster cut NODE` takes a node's veth down: no FIN, no RST). The
job: `srtr up --backend slurm --nodes 4` from the host (srtr allocates with salloc), default
launcher (the node agent), recipe = a pool `svc` of 2 `sleep` owners (`replace_lost: true`,
`critical`) plus a rider on each that ignores SIGTERM, every grace 1 s; node3 and node4 are
spares. Run dirs live under the cluster dir, which every node sees.

Measured, from the moment the link of the pool's second node goes down (`cut`):
- the node's instances gone (their processes, seen from the host, polled every 20 ms):
  target lease (5 s) + grace (1 s) + 1 s;
- the replacement running on the first spare (its process exists): after the
  fence (checked: the node's instances were gone first), target lease + grace + 3 s;
- SIGTERM to `srtr up` during the same partition → it exits: target the graces (1 s) + 2 s.
Then the same teardown with `--launcher step` (its steps on the cut-off node are cancelled,
not waited on): the same target. The link is mended after each job.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Figure, Job, Skip, write_yaml
from benchmarks.slurm_cluster import SCRIPT, Cluster, cluster
from benchmarks.slurm_scale import scan

NODES = 4
LEASE = 5.0
GRACE = 1.0
TAG = "SRTR_BENCH_TAG"


def recipe(path: Path) -> Path:
    stubborn = ["bash", "-c", "trap '' TERM; exec sleep 100000"]
    services = [
        {
            "name": "svc",
            "command": ["sleep", "100000"],
            "nodes": 2,
            "critical": True,
            "replace_lost": True,
            "stop_grace_seconds": GRACE,
        },
        {
            "name": "rider",
            "command": stubborn,
            "placement": {"pool": "svc"},
            "stop_grace_seconds": GRACE,
        },
    ]
    return write_yaml(path, {"name": "hpart", "services": services})


def _link(bench: Cluster, verb: str, node: str) -> None:
    subprocess.run([str(SCRIPT), verb, node], env=bench.env, check=True, timeout=60)


def _instances(tag: str, name: str) -> list[int]:
    needle = f"SRTR_INSTANCE={name}".encode()
    return [
        p.pid
        for p in scan(tag)
        if needle in p.environ.split(b"\0") and not p.argv[0].endswith(b"srun")
    ]


def _wait(predicate: Any, timeout: float, what: str, step: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(step)


def _idle(bench: Cluster) -> bool:
    """At least NODES nodes idle (the last job's allocation released): salloc will not queue."""
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"],
        capture_output=True,
        text=True,
        env=bench.env,
        check=False,
    )
    return len(set(done.stdout.split())) >= NODES


def _start(bench: Cluster, where: Path, *extra: str) -> tuple[Job, str, str, str]:
    """The job, its tag, the pool node to cut and the first spare (SLURM picks the nodes)."""
    _wait(lambda: _idle(bench), 120, "idle nodes", step=0.2)
    value = uuid.uuid4().hex
    env = {**bench.env, TAG: value}
    path = recipe(where / "hpart.yaml")
    job = Job(
        path,
        where / "run",
        nodes=NODES,
        extra=["--backend", "slurm", *extra],
        env=env,
        inherit_env=False,
    )
    tag = f"{TAG}={value}"
    try:
        job.wait(lambda ev: job.count("Launched") >= 4, timeout=180, step=0.1)
        carve = job.state()["carve"]
        cut, spare = carve["pools"]["svc"][1], carve["spares"][0]
        for name in ("svc", "rider"):
            _wait(lambda n=name: _instances(tag, f"service_{n}_{cut}"), 60, f"{name} on {cut}")
    except BaseException:
        job.kill()
        raise
    return job, tag, cut, spare


def partition(ctx: Context, bench: Cluster) -> dict[str, Any]:
    where = bench.dir / "runs" / f"bench-part-{uuid.uuid4().hex[:6]}"
    where.mkdir(parents=True)
    job, tag, victim, spare = _start(bench, where)
    out: dict[str, Any] = {"launcher": job.state()["job"]["launcher"], "cut": victim}
    victims = [p for n in ("svc", "rider") for p in _instances(tag, f"service_{n}_{victim}")]
    try:
        _link(bench, "cut", victim)
        cut = time.monotonic()

        def gone() -> bool:
            return not any(Path(f"/proc/{p}").exists() for p in victims)

        def replaced() -> bool:
            return bool(_instances(tag, f"service_svc_{spare}"))

        first = _wait(lambda: ("gone" if gone() else "") or ("replaced" if replaced() else ""),
                      120, "the fence or the replacement")  # fmt: skip
        out["first"] = first
        _wait(gone, 60, "the cut-off node's instances to be gone")
        out["gone_s"] = time.monotonic() - cut
        _wait(replaced, 60, f"the replacement on {spare}")
        out["replaced_s"] = time.monotonic() - cut
        job.proc.send_signal(signal.SIGTERM)
        stop = time.monotonic()
        job.proc.wait(timeout=120)
        out["teardown_s"] = time.monotonic() - stop
        out["exit"] = job.proc.returncode
    finally:
        _link(bench, "mend", victim)
        job.kill()
    ctx.log(f"slurm_partition agent: {out}")
    return out


def step_teardown(ctx: Context, bench: Cluster) -> dict[str, Any]:
    where = bench.dir / "runs" / f"bench-step-{uuid.uuid4().hex[:6]}"
    where.mkdir(parents=True)
    job, _, victim, _ = _start(bench, where, "--launcher", "step")
    out: dict[str, Any] = {}
    try:
        _link(bench, "cut", victim)
        job.proc.send_signal(signal.SIGTERM)
        stop = time.monotonic()
        job.proc.wait(timeout=120)
        out["teardown_s"] = time.monotonic() - stop
        out["exit"] = job.proc.returncode
    finally:
        _link(bench, "mend", victim)
        job.kill()
    ctx.log(f"slurm_partition step: {out}")
    return out


def run(ctx: Context) -> list[Figure]:
    bench = cluster(ctx, NODES)
    with contextlib.suppress(OSError, ValueError):
        if json.loads((bench.dir / "cluster.json").read_text()).get("kind") != "hosts":
            raise Skip("the cluster shares one network: no link to cut")
    agent = partition(ctx, bench)
    step = step_teardown(ctx, bench)
    ordered = "fence first" if agent["first"] == "gone" else "REPLACEMENT FIRST"
    return [
        Figure("slurm_partition", "link down → the node's instances gone (agent, default)",
               agent["gone_s"], "s", target=LEASE + GRACE + 1,
               note=f"lease {LEASE:g}s + grace {GRACE:g}s; launcher {agent['launcher']}"),
        Figure("slurm_partition", "link down → replacement running on a spare",
               agent["replaced_s"], "s", target=LEASE + GRACE + 3, note=ordered),
        Figure("slurm_partition", "in the partition: SIGTERM → `srtr up` exited (agent)",
               agent["teardown_s"], "s", target=GRACE + 2, note=f"exit {agent['exit']}"),
        Figure("slurm_partition", "in the partition: SIGTERM → `srtr up` exited (step)",
               step["teardown_s"], "s", target=GRACE + 2,
               note=f"exit {step['exit']}; 15.5-16.3 s before issue 22"),
    ]  # fmt: skip
