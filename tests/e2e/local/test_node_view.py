"""Simulated nodes run from where users run (issue 21): a venv, a working directory, a
program and a run dir, each under a different top-level /tmp entry.

Every host path stays visible on every node (the venv's python, the program, a host file
under /tmp), and what a node writes under /tmp is its own: each node reads back its own
`/tmp/x-<tag>`, its rider on the same node reads the same, and the host never gets one. The
srtr that runs is the venv's (`<venv>/bin/python -m srtr`, its `bin` first on PATH), so the
node agents (`--launcher agent`) start from the venv under /tmp too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.e2e_util import node_ips, read_state, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
VIEW = "node isolation: own /tmp over the host's (overlay in a mount namespace), TMPDIR=/tmp\n"


@dataclass
class Place:
    """The four /tmp entries of one test, and the name no node may leave on the host."""

    venv: Path
    work: Path
    program: Path
    run_dir: Path
    mine: Path

    def srtr(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        # The venv's bin, then the system's: nothing else provides `ray` or srtr.
        env = {**os.environ, "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
        env.pop("PYTHONPATH", None)
        argv = [str(self.venv / "bin" / "python"), "-m", "srtr", *args]
        return subprocess.run(
            argv, cwd=self.work, env=env, capture_output=True, text=True, timeout=timeout
        )


def _venv(where: Path) -> Path:
    """A venv under /tmp that sees the system's packages (Ray among them) and has srtr
    installed in development mode (a .pth file, as `pip install -e` writes)."""
    venv = where / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    (venv / rel / "srtr-dev.pth").write_text(f"{ROOT}\n")
    return venv


@pytest.fixture
def place() -> Iterator[Place]:
    tag = uuid.uuid4().hex[:8]
    entries = [Path(f"/tmp/srtr-{what}-{tag}") for what in ("venv", "work", "prog", "runs")]
    for entry in entries:
        entry.mkdir()
    venv_entry, work, prog, runs = entries
    mine = Path(f"/tmp/x-{tag}")
    try:
        yield Place(_venv(venv_entry), work, prog, runs / "run", mine)
    finally:
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
    assert not mine.exists(), "a node's /tmp write reached the host"


POOL = """
name: from-tmp
services:
  - name: box
    nodes: 3
    command: [{tool}, box]
    readiness: {{log: {{pattern: "(?m)^up$"}}, timeout_seconds: 60, interval_seconds: 0.05}}
  - name: rider
    command: [{tool}, rider]
    placement: {{pool: box}}
    readiness: {{log: {{pattern: "(?m)^up$"}}, timeout_seconds: 60, interval_seconds: 0.05}}
benchmark:
  type: custom
  command: 'cat {mine}'
"""

# The program under its own /tmp entry: it reads a host file that lives next to it, writes
# the node's own /tmp/x-<tag> (the box) and reads it back (box and rider).
TOOL = """\
#!/bin/sh
echo "$1 on $SRTR_NODE reads $(cat {data})"
[ "$1" = box ] && echo "$SRTR_NODE" > {mine}
echo "$1 on $SRTR_NODE sees $(cat {mine})"
echo up
exec sleep 1000
"""


def _tool(place: Place) -> Path:
    data = place.program / "data.txt"
    data.write_text("host data\n")
    tool = place.program / "tool.sh"
    tool.write_text(TOOL.format(data=data, mine=place.mine))
    tool.chmod(0o755)
    return tool


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_a_pool_and_its_rider_run_from_four_tmp_entries(place: Place, launcher: str) -> None:
    recipe = place.work / "recipe.yaml"
    recipe.write_text(textwrap.dedent(POOL.format(tool=_tool(place), mine=place.mine)))
    args = ("up", "recipe.yaml", "--headless", "--run-dir", str(place.run_dir))
    done = place.srtr(*args, "--launcher", launcher, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = place.run_dir / "logs"
    for node in ("node1", "node2", "node3"):
        for kind in ("box", "rider"):
            text = (logs / f"service_{kind}_{node}.out").read_text()
            assert f"{kind} on {node} reads host data\n" in text, text
            assert f"{kind} on {node} sees {node}\n" in text, text
    assert (logs / "benchmark.out").read_text() == "node1\n"
    assert (place.run_dir / "nodes" / "isolation.txt").read_text() == VIEW
    if launcher == "agent":  # the agents ran from the venv under /tmp
        agent = (logs / "agent-node1.log").read_text()
        assert "not found" not in agent, agent


VENV_RAY = "ray from the venv under /tmp"
RAY_SCRIPT = """\
#!{python}
import sys
from ray.scripts.scripts import main
print("{marker}", file=sys.stderr, flush=True)
sys.exit(main())
"""


@pytest.mark.timeout(600)
def test_the_ray_example_runs_with_ray_in_a_venv_under_tmp(place: Place) -> None:
    """`ray` resolves to the venv's own entry point (what `pip install ray` in the venv
    writes), so every node must see the venv to start Ray at all."""
    pytest.importorskip("ray", reason="ray[default] comes with the test extra")
    ray = place.venv / "bin" / "ray"
    ray.write_text(RAY_SCRIPT.format(python=place.venv / "bin" / "python", marker=VENV_RAY))
    ray.chmod(0o755)
    python3 = place.venv / "bin" / "python3"
    assert python3.exists()
    recipe = place.work / "recipe.yaml"
    shutil.copy(ROOT / "examples" / "ray-pool.yaml", recipe)
    args = ("up", "recipe.yaml", "--headless", "--run-dir", str(place.run_dir))
    done = place.srtr(*args, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    bench = (place.run_dir / "logs" / "benchmark.out").read_text()
    state = read_state(place.run_dir)
    assert state is not None
    ips = ",".join(node_ips(state)[n] for n in ("node1", "node2", "node3"))
    assert f"ray task ips: {ips}\n" in bench, bench
    assert (place.run_dir / "nodes" / "isolation.txt").read_text() == VIEW
    for node in ("node1", "node2", "node3"):  # each node started the venv's `ray`
        assert VENV_RAY in (place.run_dir / "logs" / f"service_ray_{node}.out").read_text()


LATE = """
name: late-file
services:
  - name: gate
    nodes: 2
    command: ["sh", "-c", "echo waiting; while [ ! -e {go} ]; do sleep 0.05; done; echo saw it"]
    terminal: true
"""


def test_a_file_the_host_adds_to_the_recipes_dir_later_reaches_a_node_that_looked(
    place: Place,
) -> None:
    """The recipe's directory is the host's own on every node, like the run dir and the
    working directory: a node that already looked for a file there (overlayfs would
    remember the miss) sees the host's later write."""
    recipe = place.program / "recipe.yaml"  # not in the working directory
    go = place.program / "go"
    recipe.write_text(textwrap.dedent(LATE.format(go=go)))
    env = {**os.environ, "PATH": f"{place.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    argv = [str(place.venv / "bin" / "python"), "-m", "srtr", "up", str(recipe), "--headless"]
    up = subprocess.Popen(
        [*argv, "--run-dir", str(place.run_dir)],
        cwd=place.work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        logs = place.run_dir / "logs"

        def looked() -> bool:
            outs = [logs / f"service_gate_node{k}.out" for k in (1, 2)]
            return all(p.exists() and "waiting" in p.read_text() for p in outs)

        wait_for(looked, 60, "both nodes to look for the file")
        go.touch()
        assert up.wait(60) == 0, up.stderr.read() if up.stderr else ""
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    for k in (1, 2):
        assert "saw it" in (logs / f"service_gate_node{k}.out").read_text()
