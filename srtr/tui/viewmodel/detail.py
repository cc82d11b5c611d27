"""The detail pane of the selected instance: placement, status, command, env, probe,
exit history, conditions and its recent events (the reasons behind its restarts).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from srtr.store.rundir import ready_now
from srtr.store.status import Phase
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.text import (
    age_since,
    attempt_end,
    fmt_age,
    fmt_exit,
    instance_age,
    last_exit,
)

RECENT_EVENTS = 8
# Phases that end an instance without a failure: a probe failure from before is stale.
QUIET_ENDS = frozenset({Phase.SUCCEEDED, Phase.STOPPED})


@dataclass(frozen=True, slots=True)
class DetailView:
    title: str
    facts: list[tuple[str, str]]  # (label, value) lines about placement and status
    phase: str
    command: str
    env: list[tuple[str, str]]
    probe: str
    probe_state: str  # "passing", "failing: ...", "not ready yet", "" without a probe
    last_probe_failure: str
    history: list[str]
    conditions: list[str]
    events: list[str]  # this instance's recent events: the reasons behind restarts


def detail(
    inst: Doc,
    now: float,
    *,
    events: Sequence[Doc] = (),
    last_probe_failure: str = "",
) -> DetailView:
    name = str(inst["name"])
    probe = inst.get("probe") or ""
    message = str(inst.get("probe_message") or "")
    if str(inst.get("phase", "")) in QUIET_ENDS:
        # It ended well (or was stopped): an old probe failure is no news, only noise.
        message = last_probe_failure = ""
    return DetailView(
        title=name,
        facts=_facts(inst, now),
        phase=str(inst.get("phase", "")),
        command=shlex.join(str(a) for a in inst.get("command") or []),
        env=sorted((str(k), str(v)) for k, v in (inst.get("env") or {}).items()),
        probe=str(probe),
        probe_state=_probe_state(inst, now) if probe else "",
        last_probe_failure=message or last_probe_failure,
        history=_history(inst, now),
        conditions=_conditions(inst),
        events=_recent_events(name, events, now),
    )


def _facts(inst: Doc, now: float) -> list[tuple[str, str]]:
    kind = str(inst.get("kind", ""))
    role = f"{kind} of pool {inst['pool']}" if inst.get("pool") else kind
    flags = [f"tier {inst.get('shutdown_tier', 0)}"]
    if inst.get("critical"):
        flags.append("critical")
    if inst.get("terminal"):
        flags.append("terminal")
    return [
        ("role", f"{role} · service {inst.get('service', '')}"),
        ("node", f"{inst.get('node', '')} ({inst.get('node_ip', '')})"),
        ("status", _status(inst, now)),
        ("process", _process(inst)),
        ("flags", " · ".join(flags)),
        ("log", str(inst.get("log", ""))),
    ]


def _status(inst: Doc, now: float) -> str:
    """`Ready · ready yes · up 3m`, with the next start (BackOff) or the SIGKILL to come."""
    phase = str(inst.get("phase", ""))
    status = f"{phase} · ready {'yes' if ready_now(inst) else 'no'}"
    if inst.get("started_at") is not None:
        ran = "ran" if attempt_end(inst) is not None else "up"
        status += f" · {ran} {instance_age(inst, now)}"
    if phase == Phase.BACKOFF and inst.get("next_start_at") is not None:
        status += f" · next start in {fmt_age(inst['next_start_at'] - now)}"
    if inst.get("stop_deadline") is not None:
        status += f" · SIGKILL in {fmt_age(inst['stop_deadline'] - now)}"
    return status


def _process(inst: Doc) -> str:
    """`pid 42 · step 7.3 · restarts 1 · last exit 137 (SIGKILL)`."""
    process = f"pid {inst.get('pid') or '—'}"
    if inst.get("step"):
        process += f" · step {inst['step']}"
    process += f" · restarts {inst.get('restarts', 0)}"
    exit_text = last_exit(inst)
    if exit_text:
        process += f" · last exit {exit_text}"
    return process


def _probe_state(inst: Doc, now: float) -> str:
    message = str(inst.get("probe_message") or "")
    phase = str(inst.get("phase", ""))
    if phase in QUIET_ENDS or phase in (Phase.FAILED, Phase.LOST):
        # An instance that is no longer running is not probed: nothing fails "now".
        return "passed" if inst.get("ready") else "never passed"
    if message:
        return f"failing: {message}" + _gate_left(inst, now)
    if inst.get("ready"):
        return f"passing (ready {age_since(inst.get('ready_at'), now)} ago)"
    return "not passed yet"


def _gate_left(inst: Doc, now: float) -> str:
    """` · gate fails in 42s` (or, after the stage gate: what its timeout does, and when)."""
    deadline = inst.get("probe_deadline")
    if deadline is None:
        return ""
    left = fmt_age(max(0.0, float(deadline) - now))
    if inst.get("probe_gate"):
        return f" · gate fails in {left}"
    outcome = "fails the job" if inst.get("critical") else "killed"
    return f" · {outcome} in {left}"


def _history(inst: Doc, now: float) -> list[str]:
    """Its exits, newest first: `#1 exit 137 (SIGKILL) · 3s ago · OOMKilled · killed by
    SIGKILL`, with the class of a failure (the first one stays, at the end)."""
    return [
        f"#{h.get('attempt', '?')} exit {fmt_exit(h.get('exit_code'), h.get('signal')) or '?'}"
        f" · {age_since(h.get('at'), now)} ago"
        + (f" · {h['reason']}" if h.get("reason") else "")
        + (f" · {h['message']}" if h.get("message") else "")
        for h in reversed(inst.get("history") or [])
    ]


def _conditions(inst: Doc) -> list[str]:
    return [
        f"{c.get('type')}={c.get('status')} {c.get('reason', '')}"
        + (f": {c['message']}" if c.get("message") else "")
        for c in inst.get("conditions") or []
    ]


def _recent_events(name: str, events: Sequence[Doc], now: float) -> list[str]:
    own = f"instance/{name}"
    return [
        f"{age_since(e.get('ts'), now)} ago {e.get('reason', '')}: {e.get('message', '')}"
        for e in reversed(events)
        if e.get("object") == own
    ][:RECENT_EVENTS]


def remember_probe_failures(known: Mapping[str, str], instances: Iterable[Doc]) -> dict[str, str]:
    """The last probe failure of each instance: state.json clears it once the probe passes."""
    out = dict(known)
    for inst in instances:
        message = inst.get("probe_message")
        if message:
            out[str(inst["name"])] = str(message)
    return out
