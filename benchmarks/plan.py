"""Plan: `srtr plan` of a recipe with 1,000 nodes and 20 services; target ≤ 0.5 s wall.

The recipe is torchrun-like: 4 owner pools of 250 nodes (rank, pool size and rendezvous from
placeholders, a tcp probe each) and 16 riders (4 per pool) with an http probe, so 5,000
instances. Measured as users run it: the `srtr` console script as a subprocess, stdout to a
file, wall time from spawn to exit; median of 7 runs (3 with --quick). Also `-o json`.

Baseline: `srtr plan` of the 4-node examples/pools.yaml, the fixed cost of starting Python
and importing srtr; the ratio shows what 1,000 nodes add on top of it.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Context, Figure, median, write_yaml

POOLS = 4
RIDERS = 16
NODES = 1000


def recipe(path: Path) -> Path:
    per = NODES // POOLS
    services: list[dict[str, Any]] = []
    for p in range(POOLS):
        services.append(
            {
                "name": f"train{p}",
                "command": [
                    "python3",
                    "train.py",
                    "--node-rank={index}",
                    "--nnodes={pool_node_count}",
                    "--master-addr={pool_ip}",
                    "--master-port=29500",
                ],
                "nodes": per,
                "env": {"NODE_RANK": "{index}", "MASTER_ADDR": "{pool_ip}", "HOST": "{node_ip}"},
                "readiness": {"port": 8000 + p},
            }
        )
    for r in range(RIDERS):
        services.append(
            {
                "name": f"agent{r}",
                "command": ["python3", "-m", "http.server", str(9000 + r), "--bind", "{node_ip}"],
                "placement": {"pool": f"train{r % POOLS}"},
                "env": {"POOL_HEAD": "{pool_node}", "HEAD_IP": "{head_ip}"},
                "readiness": {"http": {"port": 9000 + r, "path": "/"}},
            }
        )
    assert len(services) == 20
    return write_yaml(path, {"name": "plan1000", "services": services})


def srtr_command() -> list[str]:
    """The installed `srtr` script next to this Python, not a version-manager shim.

    On this machine `srtr` on PATH is a pyenv shim (bash + `pyenv exec`), which adds ~70 ms
    to every command; that is pyenv's cost, not srtr's.
    """
    beside = Path(sys.executable).parent / "srtr"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("srtr")
    return [found] if found else [sys.executable, "-m", "srtr"]


def wall(argv: list[str], out: Path, runs: int, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each run; with `cpu`, also the child's user+sys seconds (less
    sensitive than wall time to other work on this 2-core machine)."""
    times = []
    for _ in range(runs):
        with open(out, "wb") as handle:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(argv, stdout=handle, stderr=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if cpu is not None:
                cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("plan")
    path = recipe(where / "plan1000.yaml")
    runs = 3 if ctx.quick else 7
    srtr = srtr_command()
    wall([*srtr, "plan", str(path)], where / "warm.txt", 1)  # warm the page cache and .pyc
    cpu: list[float] = []
    text = wall([*srtr, "plan", str(path)], where / "plan.txt", runs, cpu)
    as_json = wall([*srtr, "plan", str(path), "-o", "json"], where / "plan.json", runs)
    small = wall([*srtr, "plan", str(ROOT / "examples" / "pools.yaml")], where / "small.txt", runs)
    lines = (where / "plan.txt").read_text(encoding="utf-8").count("\n")
    ctx.log(
        f"plan: 1000 nodes × 20 services: text {median(text):.3f}s, json {median(as_json):.3f}s;"
        f" 4-node example {median(small):.3f}s ({lines} lines of plan)"
    )
    return [
        Figure(
            "plan",
            f"`srtr plan`, {NODES} nodes × 20 services (5,000 instances)",
            median(text),
            "s",
            baseline=median(small),
            baseline_label="plan of the 4-node example",
            target=0.5,
            note=f"median of {runs}; CPU {median(cpu):.3f}s",
            extra={"text_s": text, "cpu_s": cpu, "json_s": as_json, "small_s": small},
        ),
        Figure(
            "plan",
            f"`srtr plan -o json`, {NODES} nodes × 20 services",
            median(as_json),
            "s",
            baseline=median(small),
            baseline_label="plan of the 4-node example",
            note=f"median of {runs}; no target",
        ),
    ]
