"""A node is a node (issues 13 and 21): each simulated node sees every host path, /tmp
included, and what it writes under /tmp is its own.

Two nodes write the same path under /tmp; each reads back only its own, the benchmark on
node 1 reads node 1's, and the host has no such file. Where the run dir lies outside /tmp
the nodes' writes stay in `<run dir>/nodes/<node>/tmp` after the job; under /tmp (the
test's own dir) they are held in memory and end with the job.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e_util import Run

pytestmark = pytest.mark.e2e

VIEW = "node isolation: own /tmp over the host's (overlay in a mount namespace), TMPDIR=/tmp\n"

RECIPE = """
name: nodetmp
services:
  - name: box
    nodes: 2
    command: [bash, -c, 'echo {node} > %(mine)s && echo "reads $(cat %(mine)s) and $(cat %(host)s)"
                        && echo "$TMPDIR" > "$SRTR_RUN_DIR/tmpdir-{node}" && echo written
                        && exec sleep 1000']
    readiness: {log: {pattern: "(?m)^written$"}, timeout_seconds: 60, interval_seconds: 0.05}
benchmark:
  type: custom
  command: 'echo "bench sees $(cat %(mine)s)"'
"""


@pytest.fixture
def names(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A path under /tmp that no node may leave on the host, and a host file under /tmp
    outside the run dir that every node must read."""
    tag = uuid.uuid4().hex[:8]
    host = tmp_path / "host-file"
    host.write_text("host data\n")
    mine = Path(f"/tmp/srtr-node-{tag}")
    yield {"mine": str(mine), "host": str(host)}
    assert not mine.exists(), "a node's /tmp write reached the host"


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_each_simulated_node_has_its_own_tmp(
    tmp_path: Path, launcher: str, names: dict[str, str]
) -> None:
    """Under `--launcher agent` each node's agent starts in its node's view, and its
    instances inherit it."""
    run = Run(tmp_path, RECIPE % names, "--launcher", launcher)
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    nodes = run.run_dir / "nodes"
    assert (nodes / "isolation.txt").read_text() == VIEW
    logs = run.run_dir / "logs"
    for node in ("node1", "node2"):
        text = (logs / f"service_box_{node}.out").read_text()
        assert f"reads {node} and host data\n" in text, text
    assert "bench sees node1\n" in (logs / "benchmark.out").read_text()
    # TMPDIR is the node's /tmp itself; the run dir (under /tmp) is the host's on each node.
    assert (run.run_dir / "tmpdir-node1").read_text() == "/tmp\n"
    assert (run.run_dir / "tmpdir-node2").read_text() == "/tmp\n"


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A dir outside /tmp for a run dir (/var/tmp: same machine, not the overlay's lower)."""
    where = Path("/var/tmp") / f"srtr-test-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    yield where
    shutil.rmtree(where)


def test_a_run_dir_outside_tmp_keeps_each_nodes_tmp_writes(
    tmp_path: Path, outside_tmp: Path, names: dict[str, str]
) -> None:
    run = Run(tmp_path, RECIPE % names, run_dir=outside_tmp / "run")
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    nodes = run.run_dir / "nodes"
    assert (nodes / "isolation.txt").read_text() == VIEW
    mine = Path(names["mine"]).name
    assert (nodes / "node1" / "tmp" / mine).read_text() == "node1\n"
    assert (nodes / "node2" / "tmp" / mine).read_text() == "node2\n"


FALLBACK = """
name: nodetmp
services:
  - name: box
    nodes: 2
    command: [bash, -c, 'echo {node} > "$TMPDIR/whoami" && echo written && exec sleep 1000']
    readiness: {log: {pattern: "^written$"}, timeout_seconds: 60, interval_seconds: 0.05}
benchmark:
  type: custom
  command: 'echo "bench sees $(cat "$TMPDIR/whoami")"'
"""


def test_with_isolation_off_nodes_get_tmpdir_and_the_reason_is_recorded(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "SRTR_NODE_ISOLATION": "tmpdir"}
    run = Run(tmp_path, FALLBACK, env=env)
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    nodes = run.run_dir / "nodes"
    assert (nodes / "isolation.txt").read_text() == (
        "node isolation: TMPDIR only; SRTR_NODE_ISOLATION=tmpdir\n"
    )
    assert "simulated nodes get TMPDIR only" not in run.err  # asked for: no warning
    assert (nodes / "node1" / "tmp" / "whoami").read_text() == "node1\n"
    assert (nodes / "node2" / "tmp" / "whoami").read_text() == "node2\n"
    assert "bench sees node1\n" in (run.run_dir / "logs" / "benchmark.out").read_text()
