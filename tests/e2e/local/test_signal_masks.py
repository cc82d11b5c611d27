"""What srtr's processes inherit of the controller's signal mask: nothing of SIGURG.

The controller takes its agents' doorbells (SIGURG) in one thread that blocks the signal
(`srtr.backends.agent.doorbells`). A signal mask crosses fork and exec, so a process started
with SIGURG blocked keeps it blocked (a Go program, which preempts its goroutines with
SIGURG, would misbehave): every process srtr starts must start with it unblocked."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.local.test_agent import agent_pids
from tests.support.e2e_util import Run, instance

pytestmark = pytest.mark.e2e

# The instance shows its own mask, then waits.
MASKS = """
name: masks
services:
  - name: shower
    command:
      - bash
      - -c
      - grep -E '^Sig(Blk|Ign):' /proc/self/status; echo shown; exec sleep 1000
    readiness: {log: {pattern: "shown"}, timeout_seconds: 30, interval_seconds: 0.1}
"""


def blocked(status: str, field: str = "SigBlk") -> set[int]:
    """The signals a `/proc/PID/status` text lists under `field` (a hex mask: bit n-1 is n)."""
    line = next(line for line in status.splitlines() if line.startswith(f"{field}:"))
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_a_launched_process_starts_with_sigurg_unblocked(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, MASKS, "--launcher", launcher)
    try:
        run.wait_state(
            lambda s: instance(s, "service_shower")["phase"] == "Ready",
            timeout=30,
            what="the instance showed its mask",
        )
        shown = (run.run_dir / "logs" / "service_shower.out").read_text()
        assert signal.SIGURG not in blocked(shown)
        assert signal.SIGURG not in blocked(shown, "SigIgn")
        if launcher == "agent":  # the agent too (it rings doorbells, it takes none)
            (pid,) = agent_pids(run).values()
            assert signal.SIGURG not in blocked(Path(f"/proc/{pid}/status").read_text())
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()
