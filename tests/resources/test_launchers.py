"""Which launcher starts an instance (`resources.launchers`), and `srtr plan --launcher`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from srtr.resources.launchers import Launcher, instance_launcher, own_step_reasons

RECIPE = """
name: mixed
services:
  - name: plain
    command: ["sleep", "1000"]
  - name: tuned
    command: ["sleep", "1000"]
    srun_options: {mem: "0"}
  - name: pinned
    command: ["sleep", "1000"]
    cpus_per_task: 2
  - name: boxed
    command: ["sleep", "1000"]
    container: "nvcr.io/nvidia/pytorch:24.01-py3"
"""


@pytest.mark.parametrize(
    ("settings", "reasons"),
    [
        ({}, []),
        ({"container": "img"}, ["container"]),
        ({"srun_options": {"mem": "0"}}, ["srun_options"]),
        ({"cpus_per_task": 4, "cpu_bind": "cores"}, ["cpus_per_task", "cpu_bind"]),
    ],
)
def test_own_step_reasons(settings: dict[str, object], reasons: list[str]) -> None:
    args: dict[str, object] = {
        "container": None,
        "cpus_per_task": None,
        "cpu_bind": None,
        "srun_options": {},
        **settings,
    }
    assert own_step_reasons(**args) == reasons  # type: ignore[arg-type]


def test_only_the_agent_launcher_sends_instances_to_their_own_step() -> None:
    assert instance_launcher(Launcher.AGENT, ["srun_options"]) is Launcher.STEP
    assert instance_launcher(Launcher.AGENT, []) is Launcher.AGENT
    assert instance_launcher(Launcher.AGENT, ["container"], steps=False) is Launcher.AGENT
    assert instance_launcher(Launcher.STEP, ["container"]) is Launcher.STEP
    assert instance_launcher(Launcher.PROCESS, ["cpu_bind"]) is Launcher.PROCESS


def plan(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(RECIPE)
    return subprocess.run(
        [sys.executable, "-m", "srtr", "plan", str(recipe), *extra],
        capture_output=True,
        text=True,
        check=True,
    )


def test_plan_shows_each_instances_launcher(tmp_path: Path) -> None:
    doc = json.loads(plan(tmp_path, "--launcher", "agent", "-o", "json").stdout)
    launchers = {i["name"]: i["launcher"] for i in doc["instances"]}
    assert launchers == {
        "service_plain": "agent",
        "service_tuned": "step",
        "service_pinned": "step",
        "service_boxed": "step",
    }
    text = plan(tmp_path, "--launcher", "agent").stdout
    assert "LAUNCHER" in text
    row = next(line for line in text.splitlines() if "service_tuned" in line)
    assert " step " in row
    # Without --launcher the table has no column, and one line says what runs where.
    default = plan(tmp_path).stdout
    assert "LAUNCHER" not in default
    assert (
        "Launcher: process locally; on SLURM the node agent, except 3 instance(s) on an srun "
        "step of their own (srun_options: service_tuned; cpus_per_task: service_pinned; "
        "container: service_boxed) (`srtr up --launcher step`: an srun step each)"
    ) in default.splitlines()
    assert "launcher" not in json.loads(plan(tmp_path, "-o", "json").stdout)["instances"][0]
    # A SLURM node list plans what `srtr up` there runs: the agent, by default.
    doc = json.loads(plan(tmp_path, "--nodelist", "gpu[1-4]", "-o", "json").stdout)
    assert {i["name"]: i["launcher"] for i in doc["instances"]} == launchers
    stepped = plan(tmp_path, "--nodelist", "gpu[1-4]", "--launcher", "step", "-o", "json")
    assert {i["launcher"] for i in json.loads(stepped.stdout)["instances"]} == {"step"}
