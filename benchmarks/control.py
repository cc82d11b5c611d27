"""Control from another host: `srtr status` and `srtr down` where no pid or socket is ours.

A local job (4 nodes × 2 `sleep` instances) runs with a run dir whose path is over 100
characters (so there is no control.sock: TCP + TLS is the only way in). "Another host" is a
new mount and pid namespace with a private /tmp, where the run dir is seen at another path
(`unshare --mount --pid --fork --mount-proc`): the controller's pid does not exist there.

Figures: the wall time of `srtr status RUN_DIR` there (median of 7; the whole command, from
the harness's fork to its exit, as a user waits for it; target ≤ 0.5 s, issue 22); one
intent's round trip over TCP + TLS from this process (`control.send`, median of 20: the
TLS handshake, the challenge and the answer); and `srtr down` there: until it returns, and
until the controller has exited (grace 2 s; the sleeps die on SIGTERM).

Skipped when not root or without `unshare` (namespaces need CAP_SYS_ADMIN).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.common import Context, Figure, Job, Skip, another_host, write_yaml

STATUS_RUNS = 7
SEND_RUNS = 20


def elsewhere(
    run_dir: Path, view: Path, *argv: str
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """(seconds, result) of `python -m srtr ARGV` in another mount and pid namespace."""
    command = " ".join(a.replace("{}", str(view)) for a in argv)
    started = time.perf_counter()
    done = subprocess.run(
        another_host(run_dir, view, command), capture_output=True, text=True, timeout=60
    )
    return time.perf_counter() - started, done


def run(ctx: Context) -> list[Figure]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise Skip("needs root and unshare for another mount and pid namespace")
    from srtr.runtime.control import ControlError, send

    where = ctx.dir("control")
    run_dir = (where / ("d" * 60) / ("e" * 40) / "run").resolve()
    assert len(str(run_dir / "control.sock")) > 100
    view = Path("/mnt") / f"srtr-bench-{os.getpid()}"
    view.mkdir(exist_ok=True)
    services = [
        {"name": "srv", "command": ["sleep", "infinity"], "nodes": 4, "stop_grace_seconds": 2},
        {"name": "side", "command": ["sleep", "infinity"], "placement": {"pool": "srv"}},
    ]
    recipe = write_yaml(where / "control.yaml", {"name": "control", "services": services})
    try:
        with Job(recipe, run_dir) as job:
            job.wait(lambda ev: job.count("Launched") >= 8, timeout=120)
            statuses = []
            for _ in range(STATUS_RUNS):
                seconds, done = elsewhere(run_dir, view, "status", "{}")
                if done.returncode != 0 or "controller=running" not in done.stdout:
                    raise RuntimeError(f"srtr status elsewhere: {done.stdout}{done.stderr}")
                statuses.append(seconds)
            sends = []
            for _ in range(SEND_RUNS):
                started = time.perf_counter()
                with contextlib.suppress(ControlError):  # no such instance: a whole round trip
                    send(run_dir, "stop", "ghost")
                sends.append(time.perf_counter() - started)
            started = time.perf_counter()
            seconds, done = elsewhere(run_dir, view, "down", "{}")
            if done.returncode != 0:
                raise RuntimeError(f"srtr down elsewhere: {done.stdout}{done.stderr}")
            job.proc.wait(60)
            ended = time.perf_counter() - started
    finally:
        with contextlib.suppress(OSError):
            view.rmdir()
    ctx.log(f"status elsewhere: {[round(s, 3) for s in statuses]}")
    return [
        Figure(
            "control",
            "srtr status from another host (median of 7)",
            statistics.median(statuses),
            "s",
            target=0.5,
            note="new pid+mount namespace, private /tmp, run dir path > 100 chars",
            extra={"runs": statuses},
        ),
        Figure(
            "control",
            "one intent over TCP + TLS (median of 20)",
            statistics.median(sends) * 1000,
            "ms",
            note="connect, TLS 1.3 handshake, pin, challenge, proof, answer",
            extra={"runs": sends},
        ),
        Figure("control", "srtr down from another host: returns", seconds, "s"),
        Figure("control", "srtr down from another host: controller exited", ended, "s"),
    ]
