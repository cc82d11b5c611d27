"""Faults and bad input that must never hurt a job (issue 9); the long runs are in tests/chaos."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from srtr.resources.expand import expand
from srtr.resources.loading import load_text
from srtr.store.persist import write_atomic
from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e


finish = Run.finish


# --- signals in every phase ------------------------------------------------------------------

PHASES = {
    # tier 2 (infra) is up; tier 1 (before_workers) waits for a probe that never passes
    "launching": """
name: sig
services:
  - name: base
    command: ["sleep", "1000"]
    start: infra
  - name: slow
    command: ["sleep", "1000"]
    start: before_workers
    readiness: {port: 9, timeout_seconds: 600}
  - name: later
    command: ["sleep", "1000"]
""",
    # every stage up: tiers 0 (owner and rider), 1 (before_workers) and 2 (infra)
    "running": """
name: sig
services:
  - name: a
    command: ["sleep", "1000"]
    nodes: 2
  - name: b
    command: ["sleep", "1000"]
    placement: {pool: a}
  - name: c
    command: ["sleep", "1000"]
    start: before_workers
    placement: {node: compute}
  - name: d
    command: ["sleep", "1000"]
    start: infra
    placement: {node: compute}
""",
}
# The tiers that hold running instances when the signal arrives.
PHASE_TIERS = {"launching": [1, 2], "running": [0, 1, 2]}


def _reached(phase: str):
    def check(state: dict) -> bool:
        if phase == "launching":
            return instance(state, "service_slow")["pid"] is not None
        return state["job"]["phase"] == "Running"

    return check


def assert_torn_down_by_tier(run: Run, state: dict) -> list[int]:
    """From events.jsonl: each tier was signalled only after every instance of the tier
    before it had exited. Returns the tiers in the order they were signalled."""
    tier_of = {i["name"]: i["shutdown_tier"] for i in state["instances"]}
    log = events(run.run_dir)
    exited = {
        e["object"].removeprefix("instance/"): at
        for at, e in enumerate(log)
        if e["reason"] == "Exited"
    }
    signalled = [
        (int(e["message"].split(":")[0].removeprefix("tier ")), at)
        for at, e in enumerate(log)
        if e["reason"] == "TearingDown" and e["message"].startswith("tier ")
    ]
    for (lower, _), (_, next_at) in itertools.pairwise(signalled):
        members = [n for n in exited if tier_of[n] == lower]
        assert members and max(exited[n] for n in members) < next_at, log
    assert sorted({tier_of[n] for n in exited}) == [t for t, _ in signalled]
    return [t for t, _ in signalled]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name
)
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_a_signal_in_any_phase_tears_down_in_order(tmp_path: Path, phase: str, signum: int) -> None:
    run = Run(tmp_path, PHASES[phase])
    try:
        run.wait_state(_reached(phase), 30, phase)
        run.signal(signum)
        assert finish(run) == 128 + signum
    finally:
        run.close()
    state = run.state()
    assert state is not None and state["job"]["exit_code"] == 128 + signum
    assert all(i["phase"] in ("Stopped", "Pending") for i in state["instances"])
    assert assert_torn_down_by_tier(run, state) == PHASE_TIERS[phase]
    reasons = [e["reason"] for e in events(run.run_dir)]
    assert reasons[-1] == "JobFailed" and "TearingDown" in reasons


def test_a_second_sigint_during_teardown_kills_at_once(tmp_path: Path) -> None:
    recipe = """
name: deaf
services:
  - name: deaf
    command: ["bash", "-c", "trap '' TERM; echo up; while true; do sleep 0.1; done"]
    stop_grace_seconds: 600
    readiness: {log: {pattern: up}, interval_seconds: 0.05}
"""
    run = Run(tmp_path, recipe)
    try:
        run.wait_state(lambda s: instance(s, "service_deaf")["ready"], 30, "ready")
        run.signal(signal.SIGINT)
        wait_for(
            lambda: any(e["message"].startswith("tier 0:") for e in events(run.run_dir)),
            10,
            "teardown started",
        )
        run.signal(signal.SIGINT)
        assert finish(run, timeout=30) == 130
    finally:
        run.close()
    assert "Killed" in [e["reason"] for e in events(run.run_dir)]


# --- logs ------------------------------------------------------------------------------------

WRITER = """
name: logs
services:
  - name: writer
    # 200 numbered lines at ~10k lines/s, then exit 1: the restart policy brings it back.
    command:
      - python3
      - -c
      - |
        import sys, time
        for i in range(200):
            print(f"line {i}", flush=True)
            time.sleep(0.0001)
        sys.exit(1)
    restart: {backoff_seconds: 0, max_backoff_seconds: 0, max_restarts: 100, window_seconds: 3600}
"""


def test_no_log_line_is_lost_across_100_restarts(tmp_path: Path) -> None:
    run = Run(tmp_path, WRITER)
    try:
        run.wait_state(
            lambda s: instance(s, "service_writer")["phase"] == "Failed",
            120,
            "the writer to spend its budget",
        )
        run.signal(signal.SIGINT)
        finish(run)
    finally:
        run.close()
    text = (run.run_dir / "logs" / "service_writer.out").read_text()
    lines = [line for line in text.splitlines() if line.startswith("line ")]
    assert len(lines) == 101 * 200
    assert lines == [f"line {i}" for _ in range(101) for i in range(200)]
    assert text.count("==== srtr: service_writer attempt") == 100


# --- files -----------------------------------------------------------------------------------


def test_state_files_are_never_torn(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    docs = [json.dumps({"n": n, "pad": "x" * (n * 5000 % 400_000)}) for n in range(200)]
    write_atomic(path, docs[0])
    stop = threading.Event()
    torn: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except ValueError as exc:
                torn.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for doc in docs:
            write_atomic(path, doc)
    finally:
        stop.set()
        thread.join()
    assert torn == []
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_run_dir_and_env_files_are_private(tmp_path: Path) -> None:
    recipe = """
name: priv
services:
  - name: s
    command: ["true"]
    env: {API_TOKEN: hunter2}
"""
    run = Run(tmp_path, recipe)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        state = run.state()
        assert state is not None
        assert instance(state, "service_s")["env"]["API_TOKEN"] == "***"
        run.signal(signal.SIGINT)
        finish(run)
    finally:
        run.close()
    assert stat.S_IMODE(run.run_dir.stat().st_mode) == 0o700
    for name in ("state.json", "recipe.yaml"):
        assert stat.S_IMODE((run.run_dir / name).stat().st_mode) == 0o600, name
    assert "hunter2" not in (run.run_dir / "state.json").read_text()
    assert "hunter2" not in (run.run_dir / "events.jsonl").read_text()


def test_node_names_with_shell_characters_stay_literal() -> None:
    recipe = load_text(
        "name: t\nservices:\n  - name: s\n    command: [echo, '{node}', '{pool_nodes}']\n"
        "    nodes: 2\n"
    )
    state = expand(recipe, [("n1;rm -rf ~", "10.0.0.1"), ("$(reboot)", "10.0.0.2")])
    argvs = sorted(s.argv for s in state.instances)
    assert argvs == [
        ("echo", "$(reboot)", "n1;rm -rf ~,$(reboot)"),
        ("echo", "n1;rm -rf ~", "n1;rm -rf ~,$(reboot)"),
    ]


# --- chaos, short ----------------------------------------------------------------------------

CHAOS_RECIPE = """
name: {name}
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: {nodes}
  - name: r1
    command: ["sleep", "1000"]
    placement: {{pool: owner}}
    restart: {{backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}}
  - name: r2
    command: ["sleep", "1000"]
    placement: {{pool: owner}}
    restart: {{backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}}
  - name: r3
    command: ["sleep", "1000"]
    placement: {{pool: owner}}
    restart: {{backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}}
"""
CHAOS = CHAOS_RECIPE.format(name="chaos", nodes=16)


def kill_pid(victim: dict) -> bool:
    try:
        os.kill(victim["pid"], signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def chaos(
    run: Run,
    seconds: float,
    period: float,
    seed: int,
    *,
    kill: Callable[[dict], bool] = kill_pid,
    handle: str = "pid",
) -> int:
    """Kill a random running rider (that has a `handle`) every `period` s with `kill`;
    return how many kills landed."""
    rng = random.Random(seed)
    kills = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = run.state()
        assert state is not None and run.proc.poll() is None, "the controller died"
        riders = [
            i
            for i in state["instances"]
            if i["kind"] == "rider" and i["phase"] == "Running" and i[handle]
        ]
        if riders:
            kills += kill(rng.choice(riders))
        time.sleep(period)  # the fault rate itself, not a wait for something observable
    return kills


def run_chaos(tmp_path: Path, seconds: float) -> None:
    run = Run(tmp_path, CHAOS)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 60, "running")
        kills = chaos(run, seconds, 0.1, seed=9)
        assert kills > 0
        state = run.wait_state(
            lambda s: all(i["phase"] == "Running" for i in s["instances"]),
            60,
            "every rider running again",
        )
        restarts = sum(i["restarts"] for i in state["instances"])
        # A rider killed twice before the state file showed its new pid counts once.
        assert 0.8 * kills <= restarts <= kills
        assert all(i["phase"] != "Failed" for i in state["instances"])
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    exited = [e for e in events(run.run_dir) if e["reason"] == "Exited"]
    launched = [e for e in events(run.run_dir) if e["reason"] == "Launched"]
    assert len(exited) == len(launched)  # every process that started was seen to end


def test_chaos_short(tmp_path: Path) -> None:
    run_chaos(tmp_path, 5)


# --- regressions found by the fuzz ----------------------------------------------------------


def test_regression_fuzz_control_character_gets_a_line() -> None:
    """A control character in the YAML was reported without a line, over two lines."""
    from srtr.resources.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        load_text("name: t\nservices: []\nx: \x08\n")
    assert caught.value.lines() == [
        "recipe.yaml:3: invalid YAML: unacceptable character #x0008 (control characters are "
        "not allowed)"
    ]


def test_regression_fuzz_key_with_a_newline_stays_on_one_line() -> None:
    """A mapping key holding a newline broke the one-problem-one-line format."""
    from srtr.resources.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        load_text('name: t\nresources:\n  ? "a\\nb"\n  : 1\n')
    (line,) = caught.value.lines()
    assert line.startswith("recipe.yaml:3: resources['a\\nb']: unknown key")
    assert "\n" not in line


def test_regression_chaos_unread_stdout_never_stalls_the_controller(tmp_path: Path) -> None:
    """Found by the 60 s chaos run: progress lines to a pipe nobody read filled it, and the
    controller blocked in print() until killed. Now lines are dropped, never waited for."""
    import subprocess
    import sys
    import textwrap

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        textwrap.dedent("""
        name: chatty
        services:
          - name: flap
            command: ["false"]
            restart: {backoff_seconds: 0, max_backoff_seconds: 0, max_restarts: 1500}
    """)
    )
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "srtr", "up", str(recipe), "--run-dir", str(run_dir), "--headless"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # stdout is never read
    )
    try:
        from tests.support.e2e_util import read_state

        wait_for(
            lambda: (
                (s := read_state(run_dir)) is not None
                and instance(s, "service_flap")["phase"] == "Failed"
            ),
            120,
            "the flapping instance to spend its 1,500 restarts",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert len(events(run_dir)) > 4500  # far more than a pipe buffer of progress lines
