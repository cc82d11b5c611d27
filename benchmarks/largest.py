"""The largest machines: N hollow nodes × M instances (default 10,000 × 8) on one controller.

Not part of the default full run (minutes, and it takes the machine): run it by name,
`python3 -m benchmarks.largest [--nodes N] [--per-node M] [--pool-nodes P]` (or
`python3 -m benchmarks.run --only largest` with `SRTR_BENCH_LARGEST=NxM` and
`SRTR_BENCH_LARGEST_POOL=P` in the environment). Two `srtr up --headless --hollow` jobs
(docs/agents.md, "Hollow mode"):

- the big one: pool `base` of N hollow nodes with M-1 riders of `sleep` (restart on-failure,
  backoff 0). Figures: `srtr up` → all N × M `Launched`; the controller's CPU and RSS while
  idle (over two laps of its periodic reads, 32 s); `srtr status RUN` (the summary), median
  of 3; the bytes the controller and the hollow process write (/proc/PID/io `write_bytes`:
  the run dir is all they write) from one instance's exit (hollow control line `exit`)
  until its relaunch is persisted (state.json or its delta log written after its
  `Launched`, or 30 s); a hollow node frozen →
  `NodeLost`; SIGTERM → the controller and the hollow process gone. The TUI's figures
  (first frame, keystroke, idle CPU with the TUI on) come from `TUI_FIGURES` when set.
- the pool: P hollow nodes, one service with `restart: {scope: pool}`, one member exits 1 →
  all P relaunched (its `Exited` → the P-th `Launched` after it).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Figure, Job, alive, idle_sample, srtr_argv, write_yaml
from benchmarks.health import restart
from benchmarks.hollow import control, node_lost, pids_with
from srtr.backends.agent.channel import READ_PERIOD
from srtr.store.rundir import STATE_FILES

SIZE_ENV = "SRTR_BENCH_LARGEST"  # "NODESxPER", e.g. "2000x8"
POOL_ENV = "SRTR_BENCH_LARGEST_POOL"
DEFAULT_NODES, DEFAULT_PER_NODE, DEFAULT_POOL = 10_000, 8, 1_000

RUNNING_TARGET = 30.0  # s
CPU_TARGET = 1.0  # % of one core
RSS_TARGET = 1024.0  # MB
LOSS_TARGET = 3.0  # s
STATUS_TARGET = 1.0  # s
RESTART_BYTES_TARGET = 64 * 1024  # bytes
SIGTERM_TARGET = 10.0  # s
POOL_TARGET = 5.0  # s
SETTLE = 10.0  # s after the last Launched: the last state.json writes are not idle
# Two whole laps of the controller's periodic reads (each lap reads every watched socket and
# an even share of those relays vouch for): a sample of part of a lap reads low or high by
# its phase.
IDLE_SECONDS = 2 * READ_PERIOD

# The TUI's figures at this size (`srtr up` on a terminal: first frame, a keystroke's answer,
# idle CPU, time to all Running): the TUI's own harness provides them. It is called with the
# context, the big job's recipe and its instance count, once the headless figures are taken,
# and runs its own job. None: those rows are listed as not measured here.
TuiFigures = Callable[[Context, Path, int], list[Figure]]


def tui_figures(ctx: Context, recipe: Path, count: int) -> list[Figure]:
    """The TUI's rows, from `benchmarks.tui_scale` on a job of the same size (its own
    recipe: `recipe` and `count` say only the size)."""
    from benchmarks import tui_scale

    nodes, per, _ = sizes(ctx)
    got = tui_scale.measure(ctx, nodes, per, headless=True)
    row = dict(scenario="largest")
    return [
        Figure(**row, name="TUI first frame", value=got["first_frame_s"], unit="s", target=2.0),
        Figure(**row, name="TUI keystroke: filter", value=got["filter_ms"], unit="ms", target=200),
        Figure(**row, name="TUI keystroke: sort", value=got["sort_ms"], unit="ms", target=200),
        Figure(
            **row,
            name="srtr up with the TUI: idle CPU",
            value=got["idle"]["cpu_percent"],
            unit="%",
            target=3.0,
        ),
        Figure(
            **row,
            name="srtr up with the TUI: all Running",
            value=got["tui_running_s"],
            unit="s",
            baseline=got["headless_running_s"],
            baseline_label="headless",
            target=1.2,
            target_on="ratio",
        ),
    ]


TUI_FIGURES: TuiFigures | None = tui_figures


def sizes(ctx: Context) -> tuple[int, int, int]:
    """(nodes, instances per node, pool nodes), from the environment or the defaults."""
    text = os.environ.get(SIZE_ENV, "")
    nodes, per = DEFAULT_NODES, DEFAULT_PER_NODE
    if text:
        a, _, b = text.lower().partition("x")
        nodes, per = int(a), int(b or DEFAULT_PER_NODE)
    pool = int(os.environ.get(POOL_ENV, DEFAULT_POOL))
    if ctx.quick:
        nodes, pool = min(nodes, 1024), min(pool, 256)
    return nodes, per, pool


def recipe(path: Path, nodes: int, per: int) -> Path:
    services: list[dict[str, Any]] = [
        {"name": "base", "command": ["sleep", "infinity"], "nodes": nodes, "restart": restart()}
    ]
    for k in range(1, per):
        services.append(
            {
                "name": f"side{k}",
                "command": ["sleep", "infinity"],
                "placement": {"pool": "base"},
                "restart": restart(),
            }
        )
    return write_yaml(path, {"name": "largest", "services": services})


def write_bytes(pids: list[int]) -> int:
    """Bytes `pids` caused to be written to storage so far (/proc/PID/io)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("write_bytes:"):
                    total += int(line.split()[1])
    return total


def status_seconds(run_dir: Path, repeats: int = 3) -> tuple[float, list[float], int]:
    """`srtr status RUN` wall times (median, all) and the last exit code. One sample when
    the first is far over its target (tens of seconds at this size before the summary)."""
    samples, code = [], 0
    for _ in range(repeats):
        if samples and samples[0] > 10 * STATUS_TARGET:
            break
        t0 = time.monotonic()
        done = subprocess.run(
            [*srtr_argv(), "status", str(run_dir)], capture_output=True, timeout=300, check=False
        )
        samples.append(time.monotonic() - t0)
        code = done.returncode
    return statistics.median(samples), samples, code


def restart_bytes(job: Job, pids: list[int], victim: str) -> dict[str, Any]:
    """One instance exits 1 and is relaunched: the bytes written until that is persisted."""
    job.poll_events()
    seen = len(job.events)
    before = write_bytes(pids)
    at = control(job, f"exit {victim} 1")
    obj = f"instance/{victim}"

    def relaunched(ev: list[dict[str, Any]]) -> Any:
        return next((e for e in ev[seen:] if e["reason"] == "Launched" and e["object"] == obj), 0)

    launched = job.wait(relaunched, timeout=60, step=0.05)

    def written() -> float:
        """The newest write of the state: state.json, or a big job's delta log."""
        stamps = [
            (job.run_dir / f).stat().st_mtime for f in STATE_FILES if (job.run_dir / f).exists()
        ]
        return max(stamps, default=0.0)

    deadline = time.monotonic() + 30
    while written() <= launched["ts"] and time.monotonic() < deadline:
        time.sleep(0.05)
    persisted = written() > launched["ts"]
    return {
        "victim": victim,
        "bytes": write_bytes(pids) - before,
        "exit_to_launched_s": launched["ts"] - at,
        "persisted": persisted,
    }


def teardown(job: Job, hollow: int) -> float:
    t0 = time.time()
    job.proc.send_signal(signal.SIGTERM)
    job.proc.wait(300)
    while alive(hollow) and time.time() - t0 < 300:
        time.sleep(0.01)
    return time.time() - t0


def measured(ctx: Context, out: dict[str, Any], what: str, take: Callable[[], Any]) -> None:
    """`out[what] = take()`; a figure that cannot be taken (a timeout) is recorded as
    missing, with why, and the next ones are still taken."""
    try:
        out[what] = take()
    except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as exc:
        out[what] = None
        out.setdefault("missing", {})[what] = repr(exc)
        ctx.log(f"largest: {what} not measured: {exc!r}")


def big_run(ctx: Context, where: Path, nodes: int, per: int) -> dict[str, Any]:
    total = nodes * per
    path = recipe(where / "largest.yaml", nodes, per)
    out: dict[str, Any] = {"nodes": nodes, "per_node": per, "instances": total}
    run_dir = where / "run"
    with Job(path, run_dir, extra=["--hollow"]) as job:
        from_up, from_stage = job.all_launched(total, timeout=1800, step=0.5)
        out["all_running_from_up_s"], out["all_running_from_stage_s"] = from_up, from_stage
        ctx.log(f"largest: {total} Running {from_up:.1f}s after `srtr up`")
        hollow = pids_with("srtr.backends.agent.hollow", str(run_dir))
        assert len(hollow) == 1, f"expected one hollow process, found {hollow}"
        time.sleep(SETTLE)
        out["idle"] = idle_sample(job.pid, IDLE_SECONDS)
        out["hollow_idle"] = idle_sample(hollow[0], 2.0)
        ctx.log(f"largest: idle {out['idle']}")
        out["status_s"], out["status_samples_s"], out["status_code"] = status_seconds(run_dir)
        out["state_json_bytes"] = (run_dir / "state.json").stat().st_size
        victim = f"service_side1_node{nodes}"
        measured(ctx, out, "restart", lambda: restart_bytes(job, [job.pid, hollow[0]], victim))
        ctx.log(f"largest: status {out['status_s']:.2f}s, restart {out['restart']}")
        measured(ctx, out, "freeze_to_node_lost_s", lambda: freeze(job))
        out["sigterm_all_gone_s"] = teardown(job, hollow[0])
        out["hollow_gone"] = not alive(hollow[0])
        ctx.log(f"largest: {out}")
    return out


def freeze(job: Job) -> float:
    job.poll_events()
    seen = len(job.events)
    at = control(job, "freeze node2")
    return float(node_lost(job, "node2", seen, timeout=60)["ts"] - at)


def pool_run(ctx: Context, where: Path, nodes: int) -> dict[str, Any]:
    svc = {
        "name": "gang",
        "command": ["sleep", "infinity"],
        "nodes": nodes,
        "restart": restart(scope="pool"),
        "stop_grace_seconds": 1,
    }
    path = write_yaml(where / "pool.yaml", {"name": "largestpool", "services": [svc]})
    out: dict[str, Any] = {"nodes": nodes}
    with Job(path, where / "pool-run", extra=["--hollow"]) as job:
        job.all_launched(nodes, timeout=600, step=0.2)
        time.sleep(3)  # the launch's last state.json writes pass
        job.poll_events()
        seen = len(job.events)
        at = control(job, "exit service_gang_node1 1")

        def relaunched(ev: list[dict[str, Any]]) -> bool:
            return sum(e["reason"] == "Launched" for e in ev[seen:]) >= nodes

        job.wait(relaunched, timeout=300, step=0.05)
        new = job.events[seen:]
        exited = next(e for e in new if e["reason"] == "Exited")
        last = max(e["ts"] for e in new if e["reason"] == "Launched")
        out["control_to_exited_s"] = exited["ts"] - at
        out["exited_to_all_launched_s"] = last - exited["ts"]
        job.stop(timeout=120)
    ctx.log(f"largest: pool {out}")
    return out


def figures(big: dict[str, Any], pool: dict[str, Any]) -> list[Figure]:
    what = f"{big['nodes']:,} hollow nodes × {big['per_node']}"
    idle = big["idle"]
    rst = big["restart"] or {"bytes": None, "persisted": False, "exit_to_launched_s": math.nan}
    return [
        Figure(
            "largest",
            f"{what}: all {big['instances']:,} Running, from `srtr up`",
            big["all_running_from_up_s"],
            "s",
            target=RUNNING_TARGET,
            note=f"{big['all_running_from_stage_s']:.1f}s from the first stage's start",
            extra={"big": big, "pool": pool},
        ),
        Figure(
            "largest",
            f"{what}: controller CPU while idle ({idle['seconds']:.0f}s)",
            idle["cpu_percent"],
            "%",
            target=CPU_TARGET,
            note=f"% of one core; hollow process {big['hollow_idle']['cpu_percent']:.1f}%",
        ),
        Figure(
            "largest", f"{what}: controller RSS, idle", idle["rss_peak_mb"], "MB", target=RSS_TARGET
        ),
        Figure(
            "largest",
            f"{what}: a hollow node frozen → NodeLost",
            big["freeze_to_node_lost_s"],
            "s",
            target=LOSS_TARGET,
            note=big.get("missing", {}).get("freeze_to_node_lost_s", ""),
        ),
        Figure(
            "largest",
            f"{what}: `srtr status RUN` (median of {len(big['status_samples_s'])})",
            big["status_s"],
            "s",
            target=STATUS_TARGET,
            note=f"exit {big['status_code']}; state.json {big['state_json_bytes'] / 1e6:.1f} MB",
        ),
        Figure(
            "largest",
            f"{what}: bytes written for one instance's restart",
            rst["bytes"],
            "B",
            target=RESTART_BYTES_TARGET,
            note=("" if rst["persisted"] else "not persisted within 30 s; ")
            + f"exit → Launched {rst['exit_to_launched_s']:.2f}s"
            + ("" if big["restart"] else f"; {big['missing']['restart']}"),
        ),
        Figure(
            "largest",
            f"{what}: SIGTERM → controller and hollow process gone",
            big["sigterm_all_gone_s"],
            "s",
            target=SIGTERM_TARGET,
            note="" if big["hollow_gone"] else "the hollow process outlived 300 s",
        ),
        Figure(
            "largest",
            f"pool of {pool['nodes']:,} hollow nodes (restart.scope: pool), one member exits 1 → "
            "all relaunched",
            pool["exited_to_all_launched_s"],
            "s",
            target=POOL_TARGET,
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("largest")
    nodes, per, pool_nodes = sizes(ctx)
    ctx.log(f"largest: {nodes} × {per}, pool of {pool_nodes} (set {SIZE_ENV}=NxM to change)")
    big = big_run(ctx, where, nodes, per)
    pool = pool_run(ctx, where, pool_nodes)
    got = figures(big, pool)
    if TUI_FIGURES is not None:
        got += TUI_FIGURES(ctx, where / "largest.yaml", nodes * per)
    else:
        ctx.log("largest: the TUI's figures are not measured here (TUI_FIGURES is None)")
    return got


def main(argv: list[str] | None = None) -> int:
    """`python3 -m benchmarks.largest`: this scenario alone through `benchmarks.run`."""
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.largest", description=__doc__)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    parser.add_argument("--per-node", type=int, default=DEFAULT_PER_NODE)
    parser.add_argument("--pool-nodes", type=int, default=DEFAULT_POOL)
    args, rest = parser.parse_known_args(argv)
    os.environ[SIZE_ENV] = f"{args.nodes}x{args.per_node}"
    os.environ[POOL_ENV] = str(args.pool_nodes)
    from benchmarks import run as harness

    return harness.main(["--only", "largest", *rest])


if __name__ == "__main__":
    sys.exit(main())
