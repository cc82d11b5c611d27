"""`source`/`build_command` and `start: with_workers` on real processes (local backend).

The repository is a real git repository made here (`git init`, a commit, a tag) and cloned
through a file:// URL; its build writes the program the service then runs (reference T-56..T-58,
S-62, T-120, T-121).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_util import Run, events, instance, processes_with

pytestmark = pytest.mark.e2e

finish = functools.partial(Run.finish, gone_within=10.0)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def make_repo(path: Path) -> Path:
    """A repository whose v1.0 builds `app/hello` (prints the greeting of that commit)."""
    path.mkdir()
    git(path, "init", "-q")
    (path / "app").mkdir()
    (path / "app" / "build.sh").write_text(
        "printf '#!/bin/sh\\necho \"hello from $(cat greeting)\"\\n' > hello && chmod +x hello\n"
    )
    (path / "app" / "greeting").write_text("v1\n")
    git(path, "add", ".")
    git(path, "commit", "-qm", "v1")
    git(path, "tag", "v1.0")
    (path / "app" / "greeting").write_text("main\n")  # a later commit on the branch
    git(path, "commit", "-qam", "moved on")
    return path


BUILT = """
name: built
services:
  - name: tool
    command: ["./hello"]
    source: {{git: "file://{repo}", rev: "{rev}", path: app}}
    build_command: [{build}]
    build_timeout_seconds: {timeout}
    terminal: true
"""


def built(repo: Path, rev: str = "v1.0", build: str = "bash, build.sh", timeout: int = 60) -> str:
    return BUILT.format(repo=repo, rev=rev, build=build, timeout=timeout)


def reasons_of(run: Run, obj: str) -> list[str]:
    return [e["reason"] for e in events(run.run_dir) if e["object"] == obj]


@pytest.mark.parametrize("by", ["tag", "sha"])
def test_the_source_is_cloned_at_its_rev_built_and_run(tmp_path: Path, repo: Path, by: str) -> None:
    rev = "v1.0" if by == "tag" else git(repo, "rev-parse", "v1.0")
    run = Run(tmp_path, built(repo, rev))
    assert finish(run) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    # the service ran the program the build wrote, from the tagged commit, not the branch's
    assert (logs / "service_tool.out").read_text() == "hello from v1\n"
    checkout = run.run_dir / "services" / "tool" / "src"
    assert git(checkout, "rev-parse", "HEAD") == git(repo, "rev-parse", "v1.0")
    assert (checkout / "app" / "hello").is_file()
    assert "Cloning into" in (logs / "service_tool.clone.out").read_text()
    state = run.state()
    assert state is not None
    for step in ("service_tool.clone", "service_tool.build"):
        record = instance(state, step)
        assert (record["kind"], record["phase"], record["critical"]) == (
            "setup",
            "Succeeded",
            False,
        )
    launched = [e["object"] for e in events(run.run_dir) if e["reason"] == "Launched"]
    assert launched == [
        "instance/service_tool.clone",
        "instance/service_tool.build",
        "instance/service_tool",
    ]


def assert_failed_before_the_service(run: Run, reason: str) -> dict[str, Any]:
    state = run.state()
    assert state is not None
    assert state["job"]["phase"] == "Failed" and state["job"]["exit_code"] == 1
    assert state["job"]["reason"] == reason
    assert f"exit code 1: {reason}" in run.out
    assert instance(state, "service_tool")["pid"] is None  # never launched
    assert not (run.run_dir / "logs" / "service_tool.out").exists()
    return state


# A commit id as rev needs no lookup at `srtr up`, so these clones fail in the job itself
# (a tag the repository lacks is refused before the job: tests/net/test_source_pins.py).
ABSENT = "0123456789abcdef0123456789abcdef01234567"


def test_a_clone_that_fails_fails_the_job(tmp_path: Path, repo: Path) -> None:
    run = Run(tmp_path, built(tmp_path / "no-such-repo", rev=ABSENT))
    assert finish(run) == 1, run.out + run.err
    assert_failed_before_the_service(
        run,
        "services[tool] source clone failed (exit 128); see logs/service_tool.clone.out",
    )
    assert (
        "does not appear to be a git repository"
        in (run.run_dir / "logs" / "service_tool.clone.out").read_text()
    )


def test_a_commit_the_repository_lacks_fails_the_clone(tmp_path: Path, repo: Path) -> None:
    run = Run(tmp_path, built(repo, rev=ABSENT))
    assert finish(run) == 1, run.out + run.err
    assert_failed_before_the_service(
        run,
        "services[tool] source clone failed (exit 128); see logs/service_tool.clone.out",
    )


def test_a_build_that_fails_fails_the_job(tmp_path: Path, repo: Path) -> None:
    run = Run(tmp_path, built(repo, build='bash, -c, "echo broken >&2; exit 3"'))
    assert finish(run) == 1, run.out + run.err
    state = assert_failed_before_the_service(
        run, "services[tool] build_command failed (exit 3); see logs/service_tool.build.out"
    )
    assert instance(state, "service_tool.clone")["phase"] == "Succeeded"
    assert (run.run_dir / "logs" / "service_tool.build.out").read_text() == "broken\n"


def test_a_build_past_its_timeout_is_killed_and_fails_the_job(tmp_path: Path, repo: Path) -> None:
    run = Run(tmp_path, built(repo, build='bash, -c, "echo building; exec sleep 1000"', timeout=2))
    assert finish(run) == 1, run.out + run.err
    state = assert_failed_before_the_service(
        run,
        "services[tool] build_command timed out after 2s and was killed; "
        "see logs/service_tool.build.out",
    )
    build = instance(state, "service_tool.build")
    assert (build["phase"], build["exit_code"]) == ("Stopped", 137)  # SIGKILL, no grace
    assert processes_with(run.marker) == []
    assert (run.run_dir / "logs" / "service_tool.build.out").read_text() == "building\n"


# --- start: with_workers ------------------------------------------------------------------------

# master and donors start with the workers, in the workers stage; {donor} is what the donor
# on node3 ({index} 1) runs before it prints its ready line. (That a deferred probe waits for
# a worker launch that is slow to come is shown in tests/controllers/test_setup_keys.py.)
WITH_WORKERS = """
name: ww
roles:
  prefill: {{nodes: 1, command: ["sleep", "1000"]}}
  decode: {{nodes: 2, command: ["sleep", "1000"]}}
frontend: {{type: generic, command: ["sleep", "1000"]}}
services:
  - name: master
    command: ["bash", "-c", "echo up; exec sleep 1000"]
    start: with_workers
    placement: {{node: infra}}
    readiness: {{log: {{pattern: "^up$"}}, timeout_seconds: 30, interval_seconds: 0.05}}
  - name: donor
    command: ["bash", "-c", "if [ {{index}} = 1 ]; then {donor}; fi; echo up; exec sleep 1000"]
    start: with_workers
    placement: {{node: decode}}
    readiness: {{log: {{pattern: "^up$"}}, timeout_seconds: {timeout}, interval_seconds: 0.05}}
"""


def launch_order(run: Run) -> list[str]:
    return [
        e["object"].removeprefix("instance/")
        for e in events(run.run_dir)
        if e["reason"] == "Launched"
    ]


def test_with_workers_services_launch_with_the_workers_and_are_probed_after_them(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, WITH_WORKERS.format(donor="true", timeout=30))
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "the job up")
        log = events(run.run_dir)
        order = launch_order(run)
        assert order == [
            "service_master",
            "service_donor_node2",
            "service_donor_node3",
            "worker_prefill_0",
            "worker_decode_0",
            "worker_decode_1",
            "frontend",
        ]
        last_worker = max(
            at for at, e in enumerate(log) if e["reason"] == "Launched" and "worker_" in e["object"]
        )
        ready = [at for at, e in enumerate(log) if e["reason"] == "Ready"]
        assert len(ready) == 3 and min(ready) > last_worker  # probed only after the workers
        frontend = next(
            at
            for at, e in enumerate(log)
            if e["reason"] == "Launched" and e["object"] == "instance/frontend"
        )
        assert frontend > max(ready)  # the frontend waits for the deferred probes
        for name in ("service_master", "service_donor_node2"):
            assert instance(state, name)["shutdown_tier"] == 1
    finally:
        run.close()


def test_a_failing_with_workers_probe_stops_the_run_before_the_frontend(tmp_path: Path) -> None:
    run = Run(tmp_path, WITH_WORKERS.format(donor="exec sleep 1000", timeout=2))
    assert finish(run) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    assert state["job"]["reason"] == (
        "services[donor] on node3 was not ready within 2s (log matches /^up$/, timeout=2s); "
        "see logs/service_donor_node3.out"
    )
    assert "frontend" not in launch_order(run)
    # cleanup saw master, donors, prefill and decode (T-121), workers (tier 0) first
    stopped = {
        e["object"].removeprefix("instance/")
        for e in events(run.run_dir)
        if e["reason"] == "Exited"
    }
    assert stopped == {
        "service_master",
        "service_donor_node2",
        "service_donor_node3",
        "worker_prefill_0",
        "worker_decode_0",
        "worker_decode_1",
    }
    assert instance(state, "frontend")["pid"] is None
