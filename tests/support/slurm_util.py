"""The SLURM test cluster for tests marked `slurm`: reuse a running one, or start it.

`scripts/test` starts the cluster before the run and stops it afterwards (even on failure)
and exports SLURM_CONF; a bare `pytest` run starts it here and stops it at the end. Tests
skip only when SLURM cannot be installed at all.

Sessions share the cluster of one SRTR_SLURM_DIR: each holds a shared lock on its
`users.lock` while it runs (`hold`), and a session that started the cluster stops it only
when no other session holds it (`scripts/slurm-cluster down --if-unused`).

The cluster's nodes are separate hosts (`separate_hosts()`; the shared-network fallback
otherwise): each node has its own network stack, hostname and /tmp. `on_node` runs a command
on a node (in its namespaces), `cut` / `mend` take a node's link down and up (a partition:
no FIN, no RST), `node_ip` is a node's address, and `shared_dir` is where run dirs go so
that every node sees them (a node's /tmp is its own: what a node writes there, the host and
the other nodes never see).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "slurm-cluster"
DIR = Path(os.environ.get("SRTR_SLURM_DIR", "/var/tmp/srtr-slurm"))


def cluster_up() -> bool:
    conf = os.environ.get("SLURM_CONF")
    if not conf or shutil.which("sinfo") is None:
        return False
    done = subprocess.run(
        ["sinfo", "-h"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SLURM_CONF": conf},
    )
    return done.returncode == 0 and bool(done.stdout.strip())


def start() -> str | None:
    """Start the cluster; return the reason it cannot run, or None once it is up."""
    done = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        if shutil.which("slurmctld") is None:
            return "SLURM cannot be installed here (slurmctld missing): " + done.stderr[-300:]
        raise RuntimeError(f"scripts/slurm-cluster up failed:\n{done.stderr[-2000:]}")
    os.environ["SLURM_CONF"] = str(DIR / "slurm.conf")
    return None


def hold() -> int:
    """Mark this session as a user of the cluster until `release` (a shared flock)."""
    DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(DIR / "users.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def release(held: int, *, stop: bool) -> None:
    """This session no longer uses the cluster; `stop`: stop it unless another session does."""
    os.close(held)
    if stop:
        subprocess.run(
            [str(CLUSTER), "down", "--if-unused"], capture_output=True, text=True, timeout=300
        )


def heal() -> None:
    """Bring back slurmd daemons a node-loss test killed (`up` restarts only the dead ones)."""
    subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True, timeout=300, check=True)


def squeue(*args: str) -> str:
    return subprocess.run(
        ["squeue", "-h", *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def cluster_nodes() -> list[str]:
    """Every node of the running cluster, in order (4 by default; `scripts/slurm-cluster up
    --nodes N` makes more): tests that fill the cluster or span it ask, never assume 4."""
    text = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return sorted(set(text.split()), key=lambda n: (len(n), n))


def slurmd_pid(node: str) -> int:
    """slurmd's pid as this machine sees it (`.hostpid`: in a node's own pid namespace)."""
    found = sorted(DIR.rglob(f"slurmd-{node}.hostpid")) or sorted(DIR.rglob(f"slurmd-{node}.pid"))
    if not found:
        raise FileNotFoundError(f"no pid file of slurmd {node} under {DIR}")
    return int(found[0].read_text().strip())


def outside_env() -> dict[str, str]:
    """The test's environment without any SLURM job of its own: srtr must allocate."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) or k == "SLURM_CONF"
    }


def info() -> dict[str, Any]:
    """What `scripts/slurm-cluster up` wrote about the running cluster (DIR/cluster.json):
    its kind ("hosts" or "shared") and, per node, its IP (and netns, host-side veth and
    holder pid on separate hosts)."""
    return dict(json.loads((DIR.resolve() / "cluster.json").read_text()))


def separate_hosts() -> bool:
    return info()["kind"] == "hosts"


def node_ip(node: str) -> str:
    return str(info()["nodes"][node]["ip"])


def on_node(node: str, argv: list[str], cwd: str | None = None) -> list[str]:
    """`argv` run on `node`: in its network, UTS and mount namespaces (and pid namespace, when
    the cluster has them), so it sees the node's hostname, address and /tmp. On the shared
    network every node is this machine: `argv` as it is. `nsenter --net=/run/netns/X`, not
    `ip netns exec`, which remounts /sys (slurm's cgroups would then be hidden)."""
    cluster = info()
    if cluster["kind"] != "hosts":
        return list(argv)
    me = cluster["nodes"][node]
    holder = me["holder"]
    enter = [
        "nsenter",
        f"--net=/run/netns/{me['netns']}",
        f"--uts=/proc/{holder}/ns/uts",
        f"--mount=/proc/{holder}/ns/mnt",
        f"--wd={cwd or os.getcwd()}",
    ]
    if cluster.get("pidns"):
        enter.append(f"--pid=/proc/{holder}/ns/pid")
    return [*enter, "--", *argv]


def run_on(node: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `argv` on `node` and wait (capture_output, text and a 60 s timeout by default)."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("timeout", 60)
    return subprocess.run(on_node(node, argv), text=True, check=False, **kwargs)


def _link(node: str, state: str) -> None:
    cluster = info()
    if cluster["kind"] != "hosts":
        raise RuntimeError("only a separate-host cluster has links to cut")
    veth = cluster["nodes"][node]["veth"]
    subprocess.run(["ip", "link", "set", veth, state], check=True, timeout=30)


def cut(node: str) -> None:
    """Take `node`'s link down: its packets go nowhere, no FIN, no RST (a dead switch port)."""
    _link(node, "down")


def mend(node: str) -> None:
    """Bring `node`'s link back up (`scripts/slurm-cluster up` also does, for every node)."""
    _link(node, "up")


def shared_dir(name: str = "") -> Path:
    """A fresh dir every node sees at the same path (under the cluster dir, outside /tmp):
    where SLURM tests put recipes and run dirs. The name is cut short: a run dir's control
    socket path must fit 100 bytes, or it falls back to the controller's own /tmp."""
    made = DIR.resolve() / "runs" / f"{name[:24] or 'test'}-{uuid.uuid4().hex[:8]}"
    made.mkdir(parents=True)
    return made
