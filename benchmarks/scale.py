"""Scale: 1,024 simulated nodes × 4 services = 4,096 `sleep` processes on the local backend.

Figures (srtr as users run it: `srtr up --headless --metrics-port 127.0.0.1:0`):
- time until all 4,096 instances are Running (from `srtr up` starting, and from the first
  stage's start), from events.jsonl;
- the controller's CPU % of one core and RSS while idle, over 30 s, from /proc/<pid>/stat and
  /proc/<pid>/status (the controller process only; its children are the instances);
- reconcile latency while single events arrive: the harness SIGKILLs one rider at a time
  (restart on-failure, backoff 0) and reads srtr_reconcile_duration_seconds before and after
  from the metrics endpoint; p99 over every reconcile in that window (histogram_quantile, so
  bucket resolution), and the end-to-end time from each kill until the relaunched process
  runs (Launched event), which is what one event costs at this size.

Node views (issue 21): the same job with per-node isolation switched off
(`SRTR_NODE_ISOLATION=tmpdir`: no mount namespaces, TMPDIR only) runs first, back to back
with the measured one, and its time to all Running is the baseline of the views' cost
(target ≤ 1.5×; all Running ≤ 8 s on a quiet 2-core machine).

Baseline: supervisord managing the same 4,096 `sleep` programs, all in one `[group:]` (time to
all RUNNING from its own log, no XML-RPC polling meanwhile; idle CPU and RSS of supervisord
itself, same /proc sampling). `supervisor.Supervisor.settings` says how it is configured and the
harness prints it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Context,
    Figure,
    Job,
    alive,
    histogram,
    histogram_delta,
    histogram_quantile,
    idle_sample,
    launched_pid,
    median,
    merge_histograms,
    percentile,
    scrape,
    write_yaml,
)
from benchmarks.supervisor import Supervisor

SERVICES = ("base", "side1", "side2", "side3")
HIST = "srtr_reconcile_duration_seconds"


def sizes(ctx: Context) -> tuple[int, float, int]:
    """(nodes, idle seconds, single events)"""
    return (256, 10.0, 30) if ctx.quick else (1024, 30.0, 100)


def recipe(path: Path, nodes: int) -> Path:
    services: list[dict[str, Any]] = [
        {"name": "base", "command": ["sleep", "infinity"], "nodes": nodes}
    ]
    for name in SERVICES[1:]:
        services.append(
            {
                "name": name,
                "command": ["sleep", "infinity"],
                "placement": {"pool": "base"},
                "restart": {"policy": "on-failure", "backoff_seconds": 0, "max_restarts": 1000},
            }
        )
    return write_yaml(path, {"name": "scale", "services": services})


def isolation_off(ctx: Context, where: Path) -> dict[str, Any]:
    """The same job with the node views switched off: time to all Running only."""
    nodes, _, _ = sizes(ctx)
    total = nodes * len(SERVICES)
    path = recipe(where / "scale-off.yaml", nodes)
    out: dict[str, Any] = {"instances": total, "load_before": os.getloadavg()}
    with Job(path, where / "run-off", env={"SRTR_NODE_ISOLATION": "tmpdir"}) as job:
        out["all_running_from_up_s"], _ = job.all_launched(total, timeout=600, step=0.2)
        isolation = (job.run_dir / "nodes" / "isolation.txt").read_text().strip()
        assert isolation.startswith("node isolation: TMPDIR only"), isolation
        job.stop(timeout=120)
    ctx.log(
        f"scale: isolation off: {total} Running {out['all_running_from_up_s']:.2f}s after "
        f"`srtr up` (load average before {out['load_before'][0]:.2f})"
    )
    return out


def srtr_scale(ctx: Context, where: Path) -> dict[str, Any]:
    nodes, idle_s, events = sizes(ctx)
    total = nodes * len(SERVICES)
    path = recipe(where / "scale.yaml", nodes)
    out: dict[str, Any] = {"instances": total}
    out["load_before"] = os.getloadavg()
    with Job(path, where / "run", metrics=True) as job:
        from_up, from_stage = job.all_launched(total, timeout=600, step=0.2)
        out["isolation"] = (job.run_dir / "nodes" / "isolation.txt").read_text().strip()
        out["all_running_from_up_s"], out["all_running_from_stage_s"] = from_up, from_stage
        ctx.log(
            f"scale: {total} Running {out['all_running_from_up_s']:.2f}s after `srtr up` "
            f"({out['all_running_from_stage_s']:.2f}s after the first stage began)"
        )
        time.sleep(3)  # let the last state.json write and metrics refresh pass
        job.poll_events()
        out["idle"] = idle_sample(job.pid, idle_s)
        ctx.log(
            f"scale: idle {out['idle']['cpu_percent']:.2f}% CPU, RSS "
            f"{out['idle']['rss_mb']:.0f} MB, {out['idle']['threads']:.0f} threads"
        )
        state = job.state()
        url = state["job"]["metrics_url"]
        pids = {
            i["name"]: i["pid"] for i in state["instances"] if i["kind"] == "rider" and i["pid"]
        }
        before = histogram(scrape(url), HIST)
        per_event = []
        victims = random.sample(sorted(pids), min(events, len(pids)))
        for name in victims:
            job.poll_events()
            seen = len(job.events)
            t_kill = time.time()
            os.kill(pids[name], signal.SIGKILL)

            def relaunched(ev: list[dict[str, Any]], name: str = name, seen: int = seen) -> Any:
                for e in ev[seen:]:
                    if e["reason"] == "Launched" and e["object"] == f"instance/{name}":
                        return e
                return None

            event = job.wait(relaunched, timeout=30, step=0.005)
            per_event.append(event["ts"] - t_kill)
            pids[name] = launched_pid(event) or pids[name]
            time.sleep(random.uniform(0.05, 0.15))
        time.sleep(1.5)  # the metrics endpoint recounts at most once a second
        after = histogram(scrape(url), HIST)
        delta = histogram_delta(after, before)
        out["reconcile_p99_s"] = histogram_quantile(0.99, merge_histograms(delta))
        out["reconcile_p50_s"] = histogram_quantile(0.50, merge_histograms(delta))
        out["reconcile_count"] = merge_histograms(delta).get(float("inf"), 0)
        out["reconcile_p99_by_controller_s"] = {
            ctl: histogram_quantile(0.99, b) for ctl, b in delta.items() if b.get(float("inf"))
        }
        out["reconcile_count_by_controller"] = {
            ctl: b.get(float("inf"), 0) for ctl, b in delta.items()
        }
        out["event_to_relaunch_s"] = per_event
        ctx.log(
            f"scale: {len(per_event)} single events: reconcile p99 "
            f"{out['reconcile_p99_s'] * 1000:.2f} ms over {out['reconcile_count']:.0f} reconciles "
            f"{out['reconcile_p99_by_controller_s']}; kill → relaunch median "
            f"{median(per_event) * 1000:.1f} ms, p99 {percentile(per_event, 99) * 1000:.1f} ms"
        )
        out["srtr_pid"] = job.pid
        job.stop(timeout=120)
    return out


def supervisor_scale(ctx: Context, where: Path) -> dict[str, Any]:
    nodes, idle_s, _ = sizes(ctx)
    programs = {f"{svc}_node{k}": "sleep infinity" for svc in SERVICES for k in range(1, nodes + 1)}
    out: dict[str, Any] = {"instances": len(programs)}
    with Supervisor(where / "supervisor", programs) as sup:
        ctx.log(f"scale: supervisord settings: {sup.settings}")
        out["settings"] = sup.settings
        last = sup.wait_all_running(len(programs), timeout=600)
        out["all_running_from_up_s"] = last - sup.started
        ctx.log(
            f"scale: supervisord: {len(programs)} RUNNING after {out['all_running_from_up_s']:.2f}s"
        )
        # Asked once, after the measurement: every program's pid.
        infos = sup.infos()
        assert all(i["statename"] == "RUNNING" for i in infos), "a program left RUNNING"
        pids = [i["pid"] for i in infos]
        time.sleep(3)
        out["idle"] = idle_sample(sup.pid, idle_s)
        ctx.log(
            f"scale: supervisord idle {out['idle']['cpu_percent']:.2f}% CPU, RSS "
            f"{out['idle']['rss_mb']:.0f} MB"
        )
        # Teardown baseline for benchmarks.teardown: SIGTERM to supervisord stops everything;
        # one group, so in one main-loop pass.
        t0 = time.time()
        sup.proc.send_signal(signal.SIGTERM)
        remaining = set(pids)
        while remaining:
            remaining = {p for p in remaining if alive(p)}
            if time.time() - t0 > 300:
                break
            time.sleep(0.05)
        out["stop_all_s"] = time.time() - t0
        sup.proc.wait(120)
        ctx.log(f"scale: supervisord stopped {len(pids)} programs in {out['stop_all_s']:.2f}s")
    ctx.shared["supervisord_scale"] = out
    return out


def run(ctx: Context) -> list[Figure]:
    where = ctx.dir("scale")
    off = isolation_off(ctx, where)
    ours = srtr_scale(ctx, where)
    theirs = supervisor_scale(ctx, where)
    n = ours["instances"]
    ms = 1000
    return [
        Figure(
            "scale",
            f"{n} instances: all Running, from `srtr up`",
            ours["all_running_from_up_s"],
            "s",
            baseline=theirs["all_running_from_up_s"],
            baseline_label="supervisord, all RUNNING (its log)",
            target=8.0,
            note=f"{ours['all_running_from_stage_s']:.2f}s from the first stage's start; "
            f"load average {ours['load_before'][0]:.2f} before",
            extra={"srtr": ours, "supervisord": theirs},
        ),
        Figure(
            "scale",
            f"{n} instances: all Running with node views ÷ isolation off (same run)",
            ours["all_running_from_up_s"],
            "s",
            baseline=off["all_running_from_up_s"],
            baseline_label="SRTR_NODE_ISOLATION=tmpdir, run just before",
            target=1.5,
            target_on="ratio",
            note=ours["isolation"].removeprefix("node isolation: "),
            extra={"isolation_off": off},
        ),
        Figure(
            "scale",
            f"{n} instances: controller CPU while idle ({ours['idle']['seconds']:.0f}s)",
            ours["idle"]["cpu_percent"],
            "%",
            baseline=theirs["idle"]["cpu_percent"],
            baseline_label="supervisord",
            target=1.0,
            note="% of one core",
        ),
        Figure(
            "scale",
            f"{n} instances: controller RSS while idle",
            ours["idle"]["rss_peak_mb"],
            "MB",
            baseline=theirs["idle"]["rss_peak_mb"],
            baseline_label="supervisord",
            target=300,
            note=f"{ours['idle']['threads']:.0f} threads",
        ),
        Figure(
            "scale",
            f"{n} instances: p99 reconcile duration during single events",
            ours["reconcile_p99_s"] * ms,
            "ms",
            note=f"{ours['reconcile_count']:.0f} reconciles; p50 "
            f"{ours['reconcile_p50_s'] * ms:.2f} ms; histogram buckets",
        ),
        Figure(
            "scale",
            f"{n} instances: one rider killed → relaunched (Launched), p99",
            percentile(ours["event_to_relaunch_s"], 99) * ms,
            "ms",
            note=f"median {median(ours['event_to_relaunch_s']) * ms:.1f} ms over "
            f"{len(ours['event_to_relaunch_s'])} kills",
        ),
    ]
