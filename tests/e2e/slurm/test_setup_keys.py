"""srtctl's keys on a real slurmctld and slurmd daemons (scripts/slurm-cluster).

`srun_export_env`: the value reaches the instance through srun's --export (the srun client's
environment, with `--export=ALL`), and is in no process's command line (reference T-71).
`source`/`build_command`: the clone and the build run as srun steps before the service, and
a build step past its timeout is killed (T-56, T-58)."""

from __future__ import annotations

import functools
import hashlib
import signal
import uuid
from pathlib import Path

import pytest

from tests.e2e.local.test_setup_keys import built, make_repo
from tests.support import slurm_util
from tests.support.e2e_util import Run, cmdlines_with, events, instance, processes_with

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


finish = functools.partial(Run.finish, timeout=120.0)

# The instance prints a digest of the exported value (the log must not hold the value
# either) and the node it sees in its own rendered copy.
EXPORTED = """
name: sexport
services:
  - name: exporter
    command:
      - bash
      - -c
      - printf %s "$EXPORTER_TOKEN" | sha256sum; echo "where=$WHERE"; exec sleep 1000
    nodes: 2
    srun_export_env: {{EXPORTER_TOKEN: "{secret}", WHERE: "on-{{node}}"}}
    readiness: {{log: {{pattern: "where=on-"}}, timeout_seconds: 60, interval_seconds: 0.2}}
"""


# Under the agent launcher too, an instance with srun_export_env keeps a step of its own (the
# wait below): the value travels through srun, not through the agent's channel.
@pytest.mark.parametrize("launcher", ["step", "agent"])
def test_srun_export_env_reaches_the_step_and_no_command_line(
    tmp_path: Path, launcher: str
) -> None:
    # commas, quotes, spaces and `$`: what `--export=K=V` on the command line would mangle
    secret = f"tok_{uuid.uuid4().hex}_a,b c'd$e"
    recipe = EXPORTED.format(secret=secret)
    run = Run(
        tmp_path,
        recipe,
        "--backend",
        "slurm",
        "--launcher",
        launcher,
        env=slurm_util.outside_env(),
    )
    try:
        run.wait_state(
            lambda s: all(
                instance(s, f"service_exporter_node{k}")["phase"] == "Ready"
                and instance(s, f"service_exporter_node{k}")["step"] is not None
                for k in (1, 2)
            ),
            90,
            "both exporters ready, each in a step of its own",
        )
        digest = hashlib.sha256(secret.encode()).hexdigest()
        for k in (1, 2):
            out = (run.run_dir / "logs" / f"service_exporter_node{k}.out").read_text()
            assert digest in out and f"where=on-node{k}\n" in out
            assert secret not in out
        assert cmdlines_with(secret) == []
        assert cmdlines_with(secret[:20]) == []
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()


# --- source / build_command as srun steps ---------------------------------------------------


def test_the_clone_and_build_run_as_steps_and_the_service_runs_the_build(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    # The step launcher (not SLURM's default agent): every phase is an srun step of its own.
    run = Run(
        tmp_path,
        built(repo),
        "--backend",
        "slurm",
        "--launcher",
        "step",
        env=slurm_util.outside_env(),
    )
    try:
        assert finish(run) == 0, run.out + run.err
        assert (run.run_dir / "logs" / "service_tool.out").read_text() == "hello from v1\n"
        steps = [e["object"] for e in events(run.run_dir) if e["reason"] == "Launched"]
        assert steps == [
            "instance/service_tool.clone",
            "instance/service_tool.build",
            "instance/service_tool",
        ]
    finally:
        run.close()


def test_a_build_step_past_its_timeout_is_killed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    recipe = built(repo, build='bash, -c, "echo building; exec sleep 1000"', timeout=3)
    run = Run(
        tmp_path, recipe, "--backend", "slurm", "--launcher", "step", env=slurm_util.outside_env()
    )
    try:
        assert finish(run) == 1, run.out + run.err
        state = run.state()
        assert state is not None
        assert state["job"]["reason"] == (
            "services[tool] build_command timed out after 3s and was killed; "
            "see logs/service_tool.build.out"
        )
        assert instance(state, "service_tool")["pid"] is None
        assert processes_with(run.marker) == []  # the step's sleep is gone
    finally:
        run.close()
