"""`srtr status` on real runs (issue 23, item 7): it says what the TUI says.

READY, the pools' counts (riders included), ages, last exits, backoff countdowns, the
launcher, spare nodes and a rejected edit all come from the TUI's view-model; user text
(recipe paths like `services[api]`) prints as written, never as Rich markup.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, wait_for

pytestmark = pytest.mark.e2e

RIDERS = """
name: box
services:
  - name: box
    command: ["sleep", "1000"]
    nodes: 2
  - name: api
    command: ["bash", "-c", "exit 4"]
    placement: {pool: box}
    restart: never
  - name: flaky
    command: ["bash", "-c", "exit 5"]
    placement: {pool: box}
    restart: {policy: on-failure, backoff_seconds: 300, max_backoff_seconds: 300}
"""


def status(run: Run, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir), *extra],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def row(text: str, name: str) -> dict[str, str]:
    """`name`'s cells by column title: the table follows the TUI's column order."""
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("NAME "))
    titles = list(re.finditer(r"\S+(?: \S+)*", header))  # "LAST EXIT" is one title
    line = next(line for line in lines if line.startswith(name + " "))
    ends = [t.start() for t in titles[1:]] + [len(line)]
    return {t.group(): line[t.start() : end].strip() for t, end in zip(titles, ends, strict=True)}


def cells(text: str, name: str, *titles: str) -> list[str]:
    found = row(text, name)
    return [found[title] for title in titles]


def _settled(state: dict) -> bool:
    phases = {i["name"]: i["phase"] for i in state["instances"]}
    return (
        phases["service_api_node1"] == "Failed"
        and phases["service_api_node2"] == "Failed"
        and phases["service_flaky_node1"] == "BackOff"
        and phases["service_flaky_node2"] == "BackOff"
    )


def test_status_agrees_with_the_tui_on_failed_riders_backoff_and_spares(tmp_path: Path) -> None:
    run = Run(tmp_path, RIDERS, "--nodes", "3")
    try:
        run.wait_state(_settled, 30, "riders Failed and BackOff")
        shown = status(run)
        header = shown.splitlines()[0]
        assert "exit_code=None" not in header  # no exit code yet: say nothing
        assert "launcher=process" in header and " age " in header
        assert "spare nodes: node3 (1)" in shown
        # The owners are ready; every rider has given up or waits: the pool line says so.
        assert "pool box 2/2 ready on node[1-2] · riders: api 0/2 ready, flaky 0/2 ready" in shown
        api = row(shown, "service_api_node1")
        assert [api["PHASE"], api["READY"], api["RESTARTS"], api["LAST EXIT"]] == [
            "Failed",
            "no",
            "0",
            "4",
        ]
        flaky = row(shown, "service_flaky_node2")
        assert [flaky["PHASE"], flaky["READY"], flaky["LAST EXIT"]] == ["BackOff", "no", "5"]
        assert flaky["NOTE"].startswith("next start in")
        assert cells(shown, "service_box_node1", "PHASE", "READY") == ["Running", "yes"]
        # A rejected live edit whose messages carry brackets, printed as written.
        run.recipe.write_text(RIDERS.replace("restart: never", 'env: {"[api]": x}'))
        state = run.wait_state(
            lambda s: (s.get("recipe") or {}).get("rejected"), 30, "the edit rejected"
        )
        shown = status(run)
        assert "recipe edit rejected: nothing running was touched" in shown
        assert "services[1].env: key '[api]' is not a valid" in shown
        assert "the recipe file differs from what runs" in shown
        assert state["job"]["phase"] == "Running"
    finally:
        run.signal(signal.SIGTERM)
        run.finish()
    shown = status(run)
    assert "exit_code=143" in shown.splitlines()[0]
    # Stopped owners are not ready any more, though their attempt once was.
    assert cells(shown, "service_box_node1", "PHASE", "READY") == ["Stopped", "no"]
    assert cells(shown, "service_box_node1", "LAST EXIT") == ["143 SIGTERM"]


def test_status_watch_reprints_on_change_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    run = Run(tmp_path, RIDERS)
    watcher = None
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        watcher = subprocess.Popen(
            [sys.executable, "-m", "srtr", "status", "--watch", str(run.run_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(iter(watcher.stdout.readline, "")))
        reader.start()
        wait_for(lambda: sum("phase=Running" in line for line in out) >= 1, 30, "first screen")
        run.signal(signal.SIGTERM)
        # The job's end rewrites state.json: the watcher prints it without being asked.
        wait_for(lambda: any("phase=Failed" in line for line in out), 30, "the end, reprinted")
        assert watcher.poll() is None  # still watching
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0
        reader.join(timeout=10)
        assert "Traceback" not in watcher.stderr.read()
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        run.finish()


def test_a_reverted_rejected_edit_is_an_event_and_a_discarded_plan_shows_as_drift(
    tmp_path: Path,
) -> None:
    from srtr.runtime.control import send
    from tests.support.e2e_util import events

    run = Run(tmp_path, RIDERS, "--apply", "confirm")
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        original = run.recipe.read_text()
        run.recipe.write_text(original.replace('["sleep", "1000"]', '"sleep 1000"'))
        run.wait_state(lambda s: (s.get("recipe") or {}).get("rejected"), 30, "rejected")
        run.recipe.write_text(original)  # reverted: the rejection clears, with an event
        run.wait_state(lambda s: not s["recipe"].get("rejected"), 30, "rejection cleared")
        wait_for(
            lambda: any(e["reason"] == "RecipeInSync" for e in events(run.run_dir)),
            30,
            "RecipeInSync",
        )
        assert "differs from what runs" not in status(run)
        # A change held for a yes, then discarded: the file still differs from what runs.
        run.recipe.write_text(original.replace("exit 4", "exit 6"))
        run.wait_state(lambda s: (s.get("recipe") or {}).get("pending"), 30, "pending plan")
        assert send(run.run_dir, "discard") == "discarded"
        state = run.wait_state(lambda s: (s.get("recipe") or {}).get("discarded"), 30, "drift")
        assert "restart" in state["recipe"]["discarded"]
        assert "the recipe file differs from what runs: its change was discarded" in status(run)
    finally:
        run.signal(signal.SIGTERM)
        run.finish()
