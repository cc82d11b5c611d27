"""The benchmark harness's verdict (issue 15, "honest numbers"): `python3 -m benchmarks.run`
exits non-zero when a target is missed or a scenario is skipped, refuses a dirty tree unless
told, and says in the results file which commit ran. The scenarios themselves are not run
here (speed lives in benchmarks/); stand-in scenario modules return fixed figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import run as bench
from benchmarks.common import Context, Figure, Skip


def scenario(name: str, body: types.FunctionType) -> None:
    module = types.ModuleType(f"benchmarks.{name}")
    module.run = body  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Stand-in scenarios `met`, `missed`, `skipped` and `broken`; a scratch dir, no C build."""
    # main() puts this checkout first on PYTHONPATH: give it back afterwards.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    scenario("met", lambda ctx: [Figure("met", "fast", 1.0, "s", target=2.0)])
    scenario("missed", lambda ctx: [Figure("missed", "slow", 3.0, "s", target=2.0)])

    def skipped(ctx: Context) -> list[Figure]:
        raise Skip("no cluster here")

    def broken(ctx: Context) -> list[Figure]:
        raise RuntimeError("boom")

    scenario("skipped", skipped)  # type: ignore[arg-type]
    scenario("broken", broken)  # type: ignore[arg-type]
    monkeypatch.setattr(bench, "SCENARIOS", ("met", "missed", "skipped", "broken"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(
        bench, "make_context", lambda quick, log: Context(quick, scratch, "/bin/true", log)
    )
    monkeypatch.setattr(bench, "uncommitted", lambda: [])
    yield tmp_path
    for name in ("met", "missed", "skipped", "broken"):
        sys.modules.pop(f"benchmarks.{name}", None)


def results(where: Path, *only: str) -> tuple[int, dict]:
    out = where / f"{'-'.join(only)}.json"
    code = bench.main(["--only", ",".join(only), "--out", str(out)])
    return code, json.loads(out.read_text())


def test_exit_zero_only_when_every_target_is_met(harness: Path) -> None:
    code, doc = results(harness, "met")
    assert code == 0
    assert doc["figures"][0]["met"] is True


def test_a_missed_target_fails_the_run(harness: Path) -> None:
    code, doc = results(harness, "met", "missed")
    assert code == 1
    assert [f["met"] for f in doc["figures"]] == [True, False]


def test_a_skipped_scenario_fails_the_run_and_says_why(harness: Path) -> None:
    code, doc = results(harness, "met", "skipped")
    assert code == 1
    assert doc["skipped"] == {"skipped": "no cluster here"}


def test_a_broken_scenario_fails_the_run_and_keeps_the_others(harness: Path) -> None:
    code, doc = results(harness, "broken", "met")
    assert code == 1
    assert "boom" in doc["errors"]["broken"]
    assert [f["scenario"] for f in doc["figures"]] == ["met"]


def test_the_results_file_names_the_commit_that_ran(harness: Path) -> None:
    _, doc = results(harness, "met")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=bench.ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert doc["machine"]["commit"] == head
    assert doc["machine"]["dirty"] is False


def test_a_dirty_tree_is_refused_unless_allowed_and_then_marked(
    harness: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "uncommitted", lambda: ["srtr/cli/run.py"])
    out = harness / "dirty.json"
    assert bench.main(["--only", "met", "--out", str(out)]) == 2
    assert not out.exists()
    assert bench.main(["--only", "met", "--out", str(out), "--allow-dirty"]) == 0
    doc = json.loads(out.read_text())
    assert doc["machine"]["dirty"] is True
    assert doc["machine"]["uncommitted"] == ["srtr/cli/run.py"]
    assert "DIRTY tree" in bench.markdown(doc)


def test_uncommitted_sees_a_new_file_but_not_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a real repository: an untracked module changes what runs; a results file
    the harness wrote does not."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    monkeypatch.setattr(bench, "ROOT", repo)
    assert bench.uncommitted() == []
    (repo / "benchmarks" / "results" / "today.json").write_text("{}")
    assert bench.uncommitted() == []
    (repo / "a.py").write_text("x = 2\n")
    (repo / "b.py").write_text("y = 1\n")
    assert sorted(bench.uncommitted()) == ["a.py", "b.py"]


def test_every_scenario_is_a_module_with_run_and_is_documented() -> None:
    """A scenario listed in SCENARIOS imports and has `run`; the README's list names each
    one in the order they run (a module that is never run, or a name that does not import,
    would only show up as a failure in a long benchmark run)."""
    import importlib
    import re

    for name in bench.SCENARIOS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(getattr(module, "run", None)), name
    readme = (Path(bench.__file__).parent / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"^Scenarios: (.*?)\n\(run in that order\)", readme, re.M | re.S)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(bench.SCENARIOS)
