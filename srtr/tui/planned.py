"""The first frame of `srtr up`'s TUI, from the plan: the job as the controller will first
write it, before it has.

On 80,000 instances the first state.json comes seconds after `srtr up` (the store built,
the first write of tens of MB) and takes the TUI more than a second to read. The plan is
known well before: the controller hands it over (`up_process.UpTui.planned`), compact
(`encode`: what each instance's row, detail pane and node cell show, with each distinct
command and environment once), and the TUI shows it as a state document (`decode`): every
instance Pending, no attempt yet, as the store's initial status (`InstanceStatus()`,
`JobStatus()`) says, until the first state.json replaces it. Nothing here says more than
the plan and the initial status do; a field that only the controller knows (its pid, the
control socket) is left out.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import orjson

from srtr.store.status import InstanceStatus, JobStatus

if TYPE_CHECKING:
    from srtr.resources.objects import DesiredState, InstanceSpec

Doc = dict[str, Any]


def encode(desired: DesiredState, *, backend: str, slurm_job_id: str | None) -> bytes:
    """The plan for the TUI (parent side: a tenth of a second on 80,000 instances), by
    column: each distinct service, placement, command and environment once, and numbers
    that point at them, so that the TUI's process reads it in a fraction of a second."""
    # The controller has the recipe's modules loaded already; the TUI's process never
    # imports them (pydantic and all: half a second of its start-up).
    from srtr.resources.render import mask

    specs = desired.instances
    services: dict[tuple[Any, ...], int] = {}
    places: dict[tuple[str, str], int] = {}
    commands: dict[tuple[str, ...], int] = {}
    envs: dict[tuple[tuple[str, str], ...], int] = {}

    def service(s: InstanceSpec) -> int:
        group = (s.service, str(s.kind), s.pool, s.shutdown_tier, s.critical, s.terminal)
        return services.setdefault(group, len(services))

    plan: dict[str, Any] = {
        "name": desired.job_name,
        "backend": backend,
        "slurm_job_id": slurm_job_id,
        "stages": [stage.name for stage in desired.stages],
        "nodes": [[n.name, n.ip, n.role] for n in desired.nodes.allocation],
        "pools": [[p.name, p.type, list(p.nodes), list(p.riders)] for p in desired.pools],
        "names": [s.name for s in specs],
        "index": [s.index for s in specs],
        "service": [service(s) for s in specs],
        "place": [places.setdefault((s.node, s.node_ip), len(places)) for s in specs],
        # The usual log's name is left out: `logs/NAME.out`.
        "log": [None if s.log == f"logs/{s.name}.out" else s.log for s in specs],
        "command": [commands.setdefault(s.argv, len(commands)) for s in specs],
        "env": [envs.setdefault(s.env, len(envs)) for s in specs],
        "probe": [s.probe.describe(s.node_ip) if s.probe else None for s in specs],
        "liveness": [s.liveness.describe(s.node_ip) if s.liveness else None for s in specs],
    }
    plan["services"] = list(services)
    plan["places"] = list(places)
    plan["commands"] = [list(argv) for argv in commands]
    plan["envs"] = [{k: mask(k, v) for k, v in env} for env in envs]
    return orjson.dumps(plan)


def read(fd: int) -> Doc:
    """The plan in descriptor `fd` (closed here) as a state document (`decode`)."""
    data = bytearray()
    try:
        # At its offset 0: the parent's writes moved the offset both share to the end.
        while chunk := os.pread(fd, 1 << 24, len(data)):
            data += chunk
    finally:
        os.close(fd)
    return decode(bytes(data))


def decode(data: bytes) -> Doc:
    """The state document of a plan `encode` made: the job and every instance as the
    controller's store starts them (no exit history, no conditions yet: left out)."""
    plan = orjson.loads(data)
    job = JobStatus()
    return {
        "job": {
            "name": plan["name"],
            "backend": plan["backend"],
            "slurm_job_id": plan["slurm_job_id"],
            "phase": str(job.phase),
            "exit_code": job.exit_code,
            "reason": job.reason,
            "generation": job.generation,
            "observed_generation": job.observed_generation,
            "stage": job.stage,
            "passed_stages": [],
            "started_at": job.started_at,
            "stages": plan["stages"],
        },
        "nodes": [{"name": n, "ip": ip, "state": role} for n, ip, role in plan["nodes"]],
        "pools": [
            {"name": name, "type": kind, "nodes": nodes, "riders": riders, "ready": False}
            for name, kind, nodes, riders in plan["pools"]
        ],
        "instances": _instances(plan),
    }


def _instances(plan: Doc) -> list[Doc]:
    """Each instance's document: a copy of its group's (service, command, environment,
    all in the order state.json has them), then what is its own. A dict's copy is one
    step in C: half the time of building 21 keys anew, on the first frame's path."""
    st = InstanceStatus()
    services, places = plan["services"], plan["places"]
    commands, envs = plan["commands"], plan["envs"]
    groups: dict[tuple[int, int, int], Doc] = {}
    out: list[Doc] = []
    columns = zip(
        plan["names"],
        plan["index"],
        plan["service"],
        plan["place"],
        plan["log"],
        plan["command"],
        plan["env"],
        plan["probe"],
        plan["liveness"],
        strict=True,
    )
    for name, index, service, place, log, command, env, probe, liveness in columns:
        key = (service, command, env)
        doc = groups.get(key)
        if doc is None:
            group = services[service]
            doc = groups[key] = {
                "name": None,
                "service": group[0],
                "kind": group[1],
                "pool": group[2],
                "index": None,
                "node": None,
                "node_ip": None,
                "phase": str(st.phase),
                "ready": False,
                "restarts": st.restarts,
                "exit_code": st.exit_code,
                "log": None,
                "shutdown_tier": group[3],
                "critical": group[4],
                "terminal": group[5],
                "command": commands[command],
                "env": envs[env],
                "probe": None,
                "started_at": st.started_at,
                "attempt": st.attempt,
                "liveness": None,
            }
        doc = doc.copy()
        doc["name"], doc["index"], (doc["node"], doc["node_ip"]) = name, index, places[place]
        doc["log"], doc["probe"], doc["liveness"] = log or f"logs/{name}.out", probe, liveness
        out.append(doc)
    return out
