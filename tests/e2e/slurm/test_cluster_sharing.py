"""Two test sessions share one SLURM test cluster: the one that ends first leaves it running.

Each session holds a shared lock on DIR/users.lock (`scripts/test`, `slurm_util.hold`) and
stops the cluster with `scripts/slurm-cluster down --if-unused`. Real flock(1) holders, on a
cluster dir of the test's own (no daemons run there, so `down` has nothing else to do)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.slurm_util import CLUSTER


def down_if_unused(cluster_dir: Path) -> str:
    done = subprocess.run(
        [str(CLUSTER), "down", "--if-unused"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SRTR_SLURM_DIR": str(cluster_dir)},
        check=True,
    )
    return done.stderr


def test_down_if_unused_leaves_the_cluster_to_a_session_that_holds_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        ["flock", "--shared", str(tmp_path / "users.lock"), "sh", "-c", "echo held; exec cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said = down_if_unused(tmp_path)
        assert "left running: another test session holds" in said
        assert f"down ({tmp_path.resolve()})" not in said
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # cat ends, and with it the hold
        holder.wait(timeout=30)
    said = down_if_unused(tmp_path)
    assert f"down ({tmp_path.resolve()})" in said
    assert "left running" not in said
