"""Helpers for end-to-end tests: run `srtr up` as a real process and watch its run dir."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


async def wait_for_async(
    predicate: Callable[[], Any], within: float = 10.0, what: str = "it"
) -> None:
    """`wait_for` inside an event loop: poll every 10 ms without blocking the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


def tier_order(seen: list[dict[str, Any]]) -> tuple[list[int], int]:
    """Where in `seen` (events.jsonl) the tier-0 instances exited and where tier 1 began.

    The HOLD recipes of the teardown tests put `base` (before_workers) in tier 1 and every
    other instance in tier 0: each of those exits must come before the "tier 1:" event.
    """
    tier1 = next(i for i, e in enumerate(seen) if e["message"].startswith("tier 1:"))
    tier0_exits = [
        i
        for i, e in enumerate(seen)
        if e["reason"] == "Exited" and "service_base" not in e["object"]
    ]
    return tier0_exits, tier1


def read_state(run_dir: Path) -> dict[str, Any] | None:
    """The run dir's state through srtr's one reader (a big job's delta log applied); None
    while there is none or it cannot be read."""
    from srtr.store.rundir import StateFileError
    from srtr.store.rundir import read_state as read_run_state

    try:
        return dict(read_run_state(run_dir).doc)
    except StateFileError:
        return None


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    # A line still being appended (a long one: a 10,000-node event) is not an event yet.
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def instance(state: dict[str, Any], name: str) -> dict[str, Any]:
    return next(i for i in state["instances"] if i["name"] == name)


def node_ips(state: dict[str, Any]) -> dict[str, str]:
    """Each node's address in this job: a local job's loopback block is whichever was free
    (127.0.0.x only when no other local job runs), so tests never assume one."""
    return {i["node"]: i["node_ip"] for i in state["instances"] if i.get("node")}


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment carries `marker` (the test's own tag)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in environ and ") Z " not in stat:
            found.append(int(entry.name))
    return found


def cmdlines_with(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose argv contains `text`: what `ps`
    shows any user of this machine."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


class Run:
    """One `srtr up` process on a recipe written to tmp_path, tagged so leftovers are findable."""

    def __init__(
        self,
        tmp_path: Path,
        recipe: str,
        *extra: str,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        run_dir: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        # run_dir: where the run dir goes (a test's tmpfs); preexec: runs in the child
        # before exec (resource limits).
        self.run_dir = run_dir or tmp_path / f"run-{uuid.uuid4().hex[:8]}"
        # Every instance gets SRTR_RUN_DIR, so its absolute path tags this run's processes.
        self.marker = f"SRTR_RUN_DIR={self.run_dir.resolve()}"
        self.recipe = tmp_path / "recipe.yaml"
        self.recipe.write_text(textwrap.dedent(recipe))
        env = dict(os.environ if env is None else env)
        self._out_path = tmp_path / f"{self.run_dir.name}.stdout"
        self._err_path = tmp_path / f"{self.run_dir.name}.stderr"
        self._out_file = self._out_path.open("w")
        self._err_file = self._err_path.open("w")
        self.proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "srtr",
                "up",
                str(self.recipe),
                "--run-dir",
                str(self.run_dir),
                "--headless",
                *extra,
            ],
            env=env,
            # Files, not pipes: a pipe nobody drains during a long run would fill up.
            stdout=self._out_file,
            stderr=self._err_file,
            text=True,
            preexec_fn=preexec,
        )
        self.out = ""
        self.err = ""
        self.adopter: subprocess.Popen[str] | None = None

    def adopt(self) -> subprocess.Popen[str]:
        """`srtr up --adopt RUN_DIR --headless`, once this run's controller was killed: the
        new controller, which `close` ends too (after the first one)."""
        self.adopter = subprocess.Popen(
            [sys.executable, "-m", "srtr", "up", "--adopt", str(self.run_dir), "--headless"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        return self.adopter

    def state(self) -> dict[str, Any] | None:
        return read_state(self.run_dir)

    def wait_state(
        self, predicate: Callable[[dict[str, Any]], Any], timeout: float = 30.0, what: str = ""
    ) -> Any:
        """Wait until `predicate(state)` holds; return that state."""

        def check() -> dict[str, Any] | None:
            state = self.state()
            return state if state is not None and predicate(state) else None

        return wait_for(check, timeout, what)

    def stdout_so_far(self) -> str:
        return self._out_path.read_text(errors="replace")

    def stderr_so_far(self) -> str:
        return self._err_path.read_text(errors="replace")

    def signal(self, signum: int = signal.SIGINT) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        self.proc.wait(timeout=timeout)
        self._collect()
        return self.proc.returncode

    def finish(self, timeout: float = 60.0, gone_within: float = 15.0) -> int:
        """Wait for `srtr up` to end, then for every process of the run to be gone."""
        try:
            code = self.wait(timeout)
        finally:
            self.close()
        wait_for(lambda: not self.leftovers(), gone_within, "every process of the run to be gone")
        return code

    def leftovers(self) -> list[int]:
        return processes_with(self.marker + "\0")

    def close(self) -> None:
        for proc in (self.proc, self.adopter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self._collect()

    def _collect(self) -> None:
        for handle in (self._out_file, self._err_file):
            handle.close()
        self.out = self._out_path.read_text()
        self.err = self._err_path.read_text()
