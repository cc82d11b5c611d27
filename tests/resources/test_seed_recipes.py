"""The seed's recipes (docs/design/seeds/pools.md), as written: no `name:`, containers, GPUs.

examples/seeds/ holds them verbatim; the first test proves it against the seed document the
repository ships, and that copy against the original where one sits beside the checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from srtr.resources.loading import default_name, load_text
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import json_schema
from tests.support.e2e_util import processes_with, read_state, wait_for

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "docs" / "design" / "seeds" / "pools.md"
SEEDS = {"pools": ROOT / "examples/seeds/pools.yaml", "sft": ROOT / "examples/seeds/sft.yaml"}


def srtr(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_examples_are_the_seed_verbatim(name: str) -> None:
    assert SEEDS[name].read_text() in SEED.read_text() + "\n"


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_seed_recipes_plan_as_written(name: str) -> None:
    done = srtr("plan", str(SEEDS[name]), "-o", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["name"] == name


def test_the_torchrun_seed_renders_its_rendezvous() -> None:
    _, desired = plan_text_source(SEEDS["sft"].read_text(), str(SEEDS["sft"]))
    ranks = [spec.argv for spec in desired.instances]
    assert [argv[3] for argv in ranks] == [f"--node-rank={k}" for k in range(4)]
    assert {argv[4] for argv in ranks} == {"--master-addr=127.0.0.2"}
    assert "sft" in desired.terminal_services


@pytest.mark.e2e
def test_the_pools_seed_runs_as_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = srtr(
        "up",
        str(SEEDS["pools"]),
        "--headless",
        "--run-dir",
        str(run_dir),
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    state = read_state(run_dir)
    assert state is not None
    assert state["job"]["name"] == "pools" and state["job"]["phase"] == "Succeeded"
    assert "train pool: node2,node3" in (run_dir / "logs" / "benchmark.out").read_text()
    assert "container 'ubuntu:24.04' of train is ignored" in done.stdout
    marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
    wait_for(lambda: not processes_with(marker), 15, "every process of the run to be gone")


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("examples/seeds/pools.yaml", "pools"),
        ("recipe.yml", "recipe"),
        ("/x/my sft run.yml", "my-sft-run"),
        ("/x/a.b.yaml", "a-b"),
        ("/x/ünï.yaml", "n"),
        ("/x/ü.yaml", "recipe"),
        ("-", "recipe"),
    ],
)
def test_a_recipe_without_name_is_named_after_its_file(file: str, name: str) -> None:
    assert default_name(file) == name
    assert load_text("services: []\n", file).name == name


def test_an_explicit_name_wins_and_the_schema_does_not_require_one() -> None:
    assert load_text("name: mine\nservices: []\n", "other.yaml").name == "mine"
    _, desired = plan_text_source(
        "services: [{name: s, command: [sleep, '1']}]\n", "recipe.yaml", name="kept"
    )
    assert desired.job_name == "kept"
    assert "name" not in json_schema().get("required", [])
