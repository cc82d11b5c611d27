"""Growing past the allocation in hollow mode (issue 24, item 6): 1,024 hollow nodes, a pool
grows by 64 nodes by live edit, and shrinks back.

`srtr up --headless --hollow` on the local backend: pool `base` of 1,024 hollow nodes with 3
riders (4,096 instances; docs/agents.md, "Hollow mode"). Once all run, the harness saves
(temp file + rename) the recipe with `nodes: 1088`: the controller asks the local simulated
provider for 64 nodes (`SRTR_LOCAL_PROVISION_DELAY=0`: granted at once, so the figures are
srtr's own cost, not a queue's), the hollow process starts their 64 agents (`add NODE` on
its control FIFO), they join, and the 256 new instances launch (owners first, then their
riders). Then it saves `nodes: 1024` again: the 256 stop and the 64 nodes go back. Figures,
all from time.time() just before the save to the event's own timestamp:

- save → `NodesJoined` (the 64 agents connected);
- save → all 256 new instances Running (their last `Launched`), and `RecipeApplied`;
- shrink: save → `NodesReleased` (every instance on them exited, the nodes given back);

and no `NodeLost` in the whole run. No target: issue 24's targets are for SLURM (a grow
job's queue time and its agents' start); this is the controller's and the channel's part of
it at 1,024 nodes. No baseline.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Context, Figure, Job, save_atomic, write_yaml

SERVICES = ("base", "side1", "side2", "side3")
NEW_NODE = re.compile(r"_node(\d+)$")


def sizes(ctx: Context) -> tuple[int, int]:
    """(nodes, nodes added)"""
    return (256, 16) if ctx.quick else (1024, 64)


def recipe(nodes: int) -> dict[str, Any]:
    services: list[dict[str, Any]] = [
        {"name": "base", "command": ["sleep", "infinity"], "nodes": nodes}
    ]
    for name in SERVICES[1:]:
        services.append(
            {"name": name, "command": ["sleep", "infinity"], "placement": {"pool": "base"}}
        )
    return {"name": "hgrow", "services": services}


def on_new_node(event: dict[str, Any], first: int) -> bool:
    found = NEW_NODE.search(event["object"])
    return found is not None and int(found.group(1)) >= first


def after(job: Job, seen: int, reason: str) -> list[dict[str, Any]]:
    return [e for e in job.events[seen:] if e["reason"] == reason]


def grow_run(ctx: Context, where: Path) -> dict[str, Any]:
    nodes, added = sizes(ctx)
    path = write_yaml(where / "grow.yaml", recipe(nodes))
    total, new = nodes * len(SERVICES), added * len(SERVICES)
    out: dict[str, Any] = {"nodes": nodes, "added": added, "new_instances": new}
    env = {"SRTR_LOCAL_PROVISION_DELAY": "0"}
    with Job(path, where / "run", extra=["--hollow"], env=env) as job:
        job.all_launched(total, timeout=300, step=0.1)
        time.sleep(3)  # let the last state.json writes pass: the save is timed alone

        job.poll_events()
        seen = len(job.events)
        t_save = time.time()
        save_atomic(path, yaml.safe_dump(recipe(nodes + added), sort_keys=False))
        job.wait(
            lambda ev: sum(on_new_node(e, nodes + 1) for e in after(job, seen, "Launched")) >= new,
            timeout=120,
            step=0.02,
        )
        joined = job.wait(lambda ev: after(job, seen, "NodesJoined"), timeout=10)[0]
        applied = job.wait(lambda ev: after(job, seen, "RecipeApplied"), timeout=10)[0]
        last = max(e["ts"] for e in after(job, seen, "Launched") if on_new_node(e, nodes + 1))
        out["joined_s"] = joined["ts"] - t_save
        out["running_s"] = last - t_save
        out["applied_s"] = applied["ts"] - t_save
        ctx.log(
            f"grow: +{added} hollow nodes: NodesJoined {out['joined_s']:.2f}s, "
            f"RecipeApplied {out['applied_s']:.2f}s, all {new} new Running "
            f"{out['running_s']:.2f}s after the save"
        )
        time.sleep(2)

        job.poll_events()
        seen = len(job.events)
        t_save = time.time()
        save_atomic(path, yaml.safe_dump(recipe(nodes), sort_keys=False))
        released = job.wait(lambda ev: after(job, seen, "NodesReleased"), timeout=120)[0]
        out["released_s"] = released["ts"] - t_save
        out["released"] = released["message"]
        # Their exits, before the release (the `Stopped` bookkeeping events may come after).
        before = job.events[seen : job.events.index(released)]
        stopped = [e for e in before if e["reason"] == "Exited" and on_new_node(e, nodes + 1)]
        out["stopped"] = len(stopped)
        ctx.log(
            f"grow: shrink back: NodesReleased {out['released_s']:.2f}s after the save "
            f"({len(stopped)} instances exited before)"
        )
        job.poll_events()
        out["node_lost"] = sum(1 for e in job.events if e["reason"] == "NodeLost")
        job.proc.send_signal(signal.SIGTERM)
        job.proc.wait(120)
    return out


def run(ctx: Context) -> list[Figure]:
    got = grow_run(ctx, ctx.dir("grow"))
    nodes, added, new = got["nodes"], got["added"], got["new_instances"]
    what = f"{nodes} hollow nodes × {len(SERVICES)}, a pool grows by {added} nodes"
    lost = f"; NodeLost events: {got['node_lost']}" if got["node_lost"] else ""
    return [
        Figure(
            "grow",
            f"{what}: save → NodesJoined",
            got["joined_s"],
            "s",
            note=f"provider delay 0 s; no target (issue 24's are for SLURM){lost}",
            extra=got,
        ),
        Figure(
            "grow",
            f"{what}: save → all {new} new instances Running",
            got["running_s"],
            "s",
            note=f"RecipeApplied after {got['applied_s']:.3f}s",
        ),
        Figure(
            "grow",
            f"{what}, then shrinks back: save → NodesReleased",
            got["released_s"],
            "s",
            note=f"{got['stopped']} of {new} instances exited before it",
        ),
    ]
