"""A node is a node (issue #13 part 5): each simulated node has its own /tmp and TMPDIR.

Two nodes write the same path, /tmp/whoami; each sees only its own, the benchmark on node 1
sees node 1's, and the files land in `<run dir>/nodes/<node>/tmp`. The test's own dir (which
holds the run dir) stays shared, as a cluster's shared filesystem would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_util import Run

pytestmark = pytest.mark.e2e

RECIPE = """
name: nodetmp
services:
  - name: box
    nodes: 2
    command: [bash, -c, 'echo {node} > /tmp/whoami && echo "$TMPDIR" > %(shared)s/tmpdir-{node}
                        && echo written && exec sleep 1000']
    readiness: {log: {pattern: "^written$"}, timeout_seconds: 60, interval_seconds: 0.05}
benchmark:
  type: custom
  command: 'echo "bench sees $(cat /tmp/whoami)"'
"""


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_each_simulated_node_has_its_own_tmp(tmp_path: Path, launcher: str) -> None:
    """Under `--launcher agent` each node's agent starts in its node's view, and its
    instances inherit it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    run = Run(tmp_path, RECIPE % {"shared": shared}, "--launcher", launcher)
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    nodes = run.run_dir / "nodes"
    assert (nodes / "isolation.txt").read_text() == (
        "node isolation: private /tmp (mount namespace) and TMPDIR\n"
    )
    assert (nodes / "node1" / "tmp" / "whoami").read_text() == "node1\n"
    assert (nodes / "node2" / "tmp" / "whoami").read_text() == "node2\n"
    assert "bench sees node1\n" in (run.run_dir / "logs" / "benchmark.out").read_text()
    # TMPDIR is the private /tmp itself; the test's dir was written through from both nodes.
    assert (shared / "tmpdir-node1").read_text() == "/tmp\n"
    assert (shared / "tmpdir-node2").read_text() == "/tmp\n"


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


def test_without_a_mount_namespace_nodes_get_tmpdir_and_the_reason_is_recorded(
    tmp_path: Path,
) -> None:
    # An `unshare` that always fails stands for a kernel that refuses mount namespaces.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    refuse = bin_dir / "unshare"
    refuse.write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    refuse.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = Run(tmp_path, FALLBACK, env=env)
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    nodes = run.run_dir / "nodes"
    assert (nodes / "isolation.txt").read_text() == (
        "node isolation: TMPDIR only; the kernel refused a private mount namespace "
        "(unshare: unshare failed: Operation not permitted)\n"
    )
    assert "simulated nodes get TMPDIR only" in run.err
    assert (nodes / "node1" / "tmp" / "whoami").read_text() == "node1\n"
    assert (nodes / "node2" / "tmp" / "whoami").read_text() == "node2\n"
    assert "bench sees node1\n" in (run.run_dir / "logs" / "benchmark.out").read_text()
