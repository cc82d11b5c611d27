"""The SLURM test cluster the SLURM scenarios run on, shared by every scenario of one run.

`scripts/slurm-cluster` takes its directory and ports from the environment, as the tests do:

    SRTR_SLURM_DIR (default here /var/tmp/srtr-slurm-bench)
    SRTR_SLURM_CTLD_PORT (6917)  SRTR_SLURM_SLURMD_PORT_BASE (18000: slurmd of node K on 18000+K
    on the shared-network fallback)

The defaults differ from the test cluster's (`/var/tmp/srtr-slurm`, 6817), so the benchmark
runs next to it (on separate hosts its subnet follows the ctld port: 10.77.5.0/24). A cluster
already running in that directory is used as it is (and left running) when it has enough
nodes; otherwise the harness starts one with `NODES` nodes and brings it down when the run
ends (`Context.cleanups`).

Its nodes are separate hosts (each its own network stack and /tmp; `separate_hosts`), so the
scenarios put their run dirs and the helper binary where every node sees them (`work`,
`helper`: under the cluster dir, outside /tmp), and address node K by its own IP (`node_ip`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Context, Skip

NODES = 32  # the 32-node scenario's size; the 16-node one allocates half of it
DEFAULTS = {
    "SRTR_SLURM_DIR": "/var/tmp/srtr-slurm-bench",
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
        run = self.dir / "run"
        path = run / f"slurmd-{node}.hostpid"  # in a node's own pid namespace
        return int((path if path.exists() else run / f"slurmd-{node}.pid").read_text().strip())

    def info(self) -> dict[str, Any]:
        """What `scripts/slurm-cluster up` wrote about the cluster (DIR/cluster.json)."""
        return dict(json.loads((self.dir / "cluster.json").read_text(encoding="utf-8")))

    def separate_hosts(self) -> bool:
        return bool(self.info()["kind"] == "hosts")

    def node_ip(self, node: str) -> str:
        return str(self.info()["nodes"][node]["ip"])

    def on_node(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run in `node`'s namespaces (as is on the shared network): nsenter itself,
        not `scripts/slurm-cluster exec`, so that timings carry no bash start."""
        info = self.info()
        if info["kind"] != "hosts":
            return list(argv)
        me = info["nodes"][node]
        holder = me["holder"]
        enter = [
            "nsenter",
            f"--net=/run/netns/{me['netns']}",
            f"--uts=/proc/{holder}/ns/uts",
            f"--mount=/proc/{holder}/ns/mnt",
            f"--wd={os.getcwd()}",
        ]
        if info.get("pidns"):
            enter.append(f"--pid=/proc/{holder}/ns/pid")
        return [*enter, "--", *argv]

    def link(self, node: str, up: bool) -> None:
        """Cut (`up=False`) or mend `node`'s link: a partition, no FIN, no RST."""
        done = self._script("mend" if up else "cut", node)
        if done.returncode != 0:
            raise RuntimeError(f"slurm-cluster {'mend' if up else 'cut'} {node}: {done.stderr}")

    def work(self, ctx: Context, name: str) -> Path:
        """A fresh dir for a scenario's recipe and run dir that every node sees (a node's
        /tmp, where `ctx.dir` puts things, is its own)."""
        path = self.dir / "runs" / "bench" / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def helper(self, ctx: Context) -> str:
        """The helper binary (benchmarks/helper.c), copied where every node sees it."""
        path = self.dir / "runs" / "bench" / "helper"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ctx.helper, path)
        return str(path)

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
    # Every scenario's instances run the helper on the nodes: from where they all see it.
    ctx.helper = made.helper(ctx)
    ctx.shared["slurm_cluster"] = made
    ctx.cleanups.append(made.down)
    ctx.log(f"slurm: {made.describe()}")
    return made
