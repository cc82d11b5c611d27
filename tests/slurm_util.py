"""The SLURM test cluster for tests marked `slurm`: reuse a running one, or start it.

`scripts/test` starts the cluster before the run and stops it afterwards (even on failure)
and exports SLURM_CONF; a bare `pytest` run starts it here and stops it at the end. Tests
skip only when SLURM cannot be installed at all.

Sessions share the cluster of one SRTR_SLURM_DIR: each holds a shared lock on its
`users.lock` while it runs (`hold`), and a session that started the cluster stops it only
when no other session holds it (`scripts/slurm-cluster down --if-unused`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "slurm-cluster"
DIR = Path(os.environ.get("SRTR_SLURM_DIR", "/tmp/srtr-slurm"))


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


def slurmd_pid(node: str) -> int:
    found = sorted(DIR.rglob(f"slurmd-{node}.pid"))
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
