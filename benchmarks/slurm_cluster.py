"""The SLURM test cluster the SLURM scenarios run on, shared by every scenario of one run.

`scripts/slurm-cluster` takes its directory and ports from the environment, as the tests do:

    SRTR_SLURM_DIR (default here /tmp/srtr-slurm-bench)
    SRTR_SLURM_CTLD_PORT (6917)  SRTR_SLURM_SLURMD_PORT_BASE (18000: slurmd of node K on 18000+K)

The defaults differ from the test cluster's (`/tmp/srtr-slurm`, 6817, 17001+), so the benchmark
runs next to it. A cluster already running in that directory is used as it is (and left
running) when it has enough nodes; otherwise the harness starts one with `NODES` nodes and
brings it down when the run ends (`Context.cleanups`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from benchmarks.common import ROOT, Context, Skip

NODES = 32  # the 32-node scenario's size; the 16-node one allocates half of it
DEFAULTS = {
    "SRTR_SLURM_DIR": "/tmp/srtr-slurm-bench",
    "SRTR_SLURM_CTLD_PORT": "6917",
    "SRTR_SLURM_SLURMD_PORT_BASE": "18000",
}
SCRIPT = ROOT / "scripts" / "slurm-cluster"


class Cluster:
    def __init__(self) -> None:
        self.settings = {k: os.environ.get(k) or v for k, v in DEFAULTS.items()}
        self.dir = Path(self.settings["SRTR_SLURM_DIR"])
        self.conf = str(self.dir / "slurm.conf")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env.update(self.settings)
        self.env["SLURM_CONF"] = self.conf
        self.owned = False
        self.nodes = 0

    def describe(self) -> str:
        s = self.settings
        owner = "started by the harness" if self.owned else "already running, left running"
        return (
            f"{self.nodes}-node cluster in {s['SRTR_SLURM_DIR']} (slurmctld "
            f"{s['SRTR_SLURM_CTLD_PORT']}, slurmd {s['SRTR_SLURM_SLURMD_PORT_BASE']}+K; {owner})"
        )

    def _script(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
            timeout=timeout,
        )

    def conf_nodes(self) -> int:
        try:
            text = Path(self.conf).read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0
        return len(re.findall(r"^NodeName=", text, re.M))

    def up(self, want: int) -> None:
        if not shutil.which("srun") and not shutil.which("apt-get"):
            raise Skip("no SLURM and no apt-get to install it")
        if self._script("status").returncode == 0:
            self.nodes = self.conf_nodes()
            if self.nodes < want:
                raise RuntimeError(
                    f"the cluster in {self.dir} runs with {self.nodes} nodes, {want} needed; "
                    "stop it or point SRTR_SLURM_DIR (and the ports) elsewhere"
                )
            return
        done = self._script("up", "--nodes", str(want))
        if done.returncode != 0 or f"export SLURM_CONF={self.conf}" not in done.stdout:
            raise RuntimeError(
                f"slurm-cluster up failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        self.owned, self.nodes = True, want

    def heal(self) -> None:
        """Restart the slurmd daemons a node-loss measurement killed (same conf, same N)."""
        done = self._script("up", "--nodes", str(self.nodes))
        if done.returncode != 0:
            raise RuntimeError(f"slurm-cluster up (heal) failed: {done.stderr[-2000:]}")

    def slurmd_pid(self, node: str) -> int:
        return int((self.dir / "run" / f"slurmd-{node}.pid").read_text().strip())

    def down(self) -> None:
        if self.owned:
            self._script("down", timeout=300)


def cluster(ctx: Context, want: int = NODES) -> Cluster:
    """The run's cluster, started on first use and brought down when the run ends."""
    found = ctx.shared.get("slurm_cluster")
    if isinstance(found, Cluster):
        return found
    made = Cluster()
    made.up(want)
    ctx.shared["slurm_cluster"] = made
    ctx.cleanups.append(made.down)
    ctx.log(f"slurm: {made.describe()}")
    return made
