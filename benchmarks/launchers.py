"""Head-node cost of the step and agent launchers on SLURM (issue 15): srun clients and RSS.

    SLURM_CONF=... python3 -m benchmarks.launchers [--nodes 4] [--per-node 8] [--rounds 1]

Runs `srtr up --backend slurm --launcher L` for L in step, agent on N nodes with K
instances per node (one pool of N plus K-1 riders on it, each `sleep`), on the cluster that
SLURM_CONF names (scripts/slurm-cluster; SRTR_SLURM_* select your own). Once every instance
runs it counts, on this machine (the head node):

- srun processes of the job (the clients and their helpers);
- RSS of srtr's controller and of those srun processes;
- RSS of the agents (on a real cluster they are on the nodes, one each; on the one-machine
  test cluster they are here too, so they are reported apart);
- seconds from `srtr up` to every instance running, and from SIGTERM to every process gone.

It prints one line per launcher. Nothing here is a target check: see docs/agents.md for the
figures and what they mean.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = """
name: launchers
services:
  - name: pool
    command: ["sleep", "100000"]
    nodes: {nodes}
{riders}
"""
RIDER = """  - name: r{k}
    command: ["sleep", "100000"]
    placement: {{pool: pool}}
"""


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def processes() -> list[tuple[int, int, list[str], bytes]]:
    """(pid, ppid, argv, environ) of every readable process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append((int(entry.name), ppid, [a.decode(errors="replace") for a in argv], environ))
    return out


def measure(run_dir: Path, controller: int, job_id: str) -> dict[str, float]:
    marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0".encode()
    procs = processes()
    sruns = [p for p in procs if p[2][:3] == ["srun", "--jobid", job_id]]
    agents = [
        p
        for p in procs
        if "srtr.backends.agent.node" in p[2] and p[2][0] != "srun" and marker in p[3]
    ]
    return {
        "srun_processes": len(sruns),
        "controller_mb": rss_kb(controller) / 1024,
        "srun_mb": sum(rss_kb(p[0]) for p in sruns) / 1024,
        "agents": len(agents),
        "agent_mb_each": (sum(rss_kb(p[0]) for p in agents) / 1024 / len(agents)) if agents else 0,
    }


def state(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None


def all_running(doc: dict | None, count: int) -> bool:
    if doc is None or doc["job"]["phase"] != "Running":
        return False
    live = [i for i in doc["instances"] if i["phase"] in ("Running", "Ready")]
    return len(live) == count


def wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def one(launcher: str, nodes: int, per_node: int, scratch: Path) -> dict[str, float]:
    riders = "".join(RIDER.format(k=k) for k in range(1, per_node))
    recipe = scratch / f"{launcher}.yaml"
    recipe.write_text(RECIPE.format(nodes=nodes, riders=riders))
    run_dir = scratch / f"run-{launcher}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")) or k == "SLURM_CONF"
    }
    argv = [sys.executable, "-m", "srtr", "up", str(recipe), "--headless", "--backend", "slurm"]
    argv += ["--launcher", launcher, "--nodes", str(nodes), "--run-dir", str(run_dir)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        doc = wait(
            lambda: (s := state(run_dir)) and all_running(s, nodes * per_node) and s,
            300,
            "all running",
        )
        up = time.monotonic() - started
        figures = measure(run_dir, proc.pid, str(doc["job"]["slurm_job_id"]))
        stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0".encode()
        wait(lambda: not any(marker in p[3] for p in processes()), 120, "every process gone")
        figures.update(up_s=up, teardown_s=time.monotonic() - stop)
        return figures
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.launchers")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=8)
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        print("set SLURM_CONF to the test cluster's slurm.conf", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="srtr-launchers-") as scratch:
        for launcher in ("step", "agent"):
            figures = one(launcher, args.nodes, args.per_node, Path(scratch))
            head = figures["controller_mb"] + figures["srun_mb"]
            print(
                f"{launcher:5}  {args.nodes} nodes x {args.per_node}: "
                f"srun processes {figures['srun_processes']:.0f}, "
                f"RSS controller {figures['controller_mb']:.1f} MB"
                f" + srun {figures['srun_mb']:.1f} MB = {head:.1f} MB; "
                f"agents {figures['agents']:.0f} x {figures['agent_mb_each']:.1f} MB; "
                f"all running after {figures['up_s']:.2f} s; "
                f"SIGTERM -> all gone {figures['teardown_s']:.2f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
