"""The job's first failure: how an exit is classified, and how the cause is written.

A job that fails is reported by its *first* failure, not its worst exit code: when one rank
of a rendezvous dies, the others abort later with codes of their own (134, 137), and the
one that started it all is the one to look at. The store keeps that first failure as
`JobStatus.cause` (`cause_transitions.py`); this module is pure: values in, text out.

Exits srtr caused (a teardown, a stop or planned restart it sent) are never failures; an
exit 0 is none either. What remains is classified, as Kubernetes' `terminated.reason`:

- `OOMKilled`: the kernel's OOM killer ended it (the backend saw it in the instance's
  memory cgroup, or SLURM reported OUT_OF_MEMORY);
- `LivenessFailed`: srtr stopped it because its liveness probe failed;
- `NodeLost`: its node went away;
- `LaunchFailed`: its program never ran (the launch failed, or it exited 127/126 at once);
- `Error`: any other non-zero exit or signal.
"""

from __future__ import annotations

import re
import signal as signals
import time
from collections.abc import Sequence

from srtr.store.rundir import CauseDoc
from srtr.store.status import Cause, ExitRecord

OOM_KILLED = "OOMKilled"
LIVENESS_FAILED = "LivenessFailed"
NODE_LOST = "NodeLost"
LAUNCH_FAILED = "LaunchFailed"
ERROR = "Error"

# What a backend (or a controller that stopped an instance for its health) may report as
# the reason of an exit; anything else is classified from the code and signal.
REPORTED = frozenset({OOM_KILLED, LIVENESS_FAILED})
# Failures even when srtr sent the stop: a liveness probe's kill is srtr's hand, not its
# plan, and the kernel's OOM kill is nobody's plan.
ALWAYS_FAILURES = frozenset({OOM_KILLED, LIVENESS_FAILED})
# A shell's (and srtr's, for a launch it could not make) "not found" and "cannot execute".
NEVER_RAN_CODES = frozenset({126, 127})
HISTORY_KEPT = 20  # exits kept in state.json per instance (the first failure on top)


def classify(
    exit_code: int | None, signal: int | None, *, reported: str = "", lost: bool = False
) -> str | None:
    """The failure class of an attempt's end, or None when it is no failure (exit 0).

    `reported`: what the backend or a controller knew (OOMKilled, LivenessFailed).
    """
    if lost:
        return NODE_LOST
    if reported in REPORTED:
        return reported
    if not signal and exit_code == 0:
        return None
    if not signal and exit_code in NEVER_RAN_CODES:
        return LAUNCH_FAILED
    return ERROR


def signal_name(signal: int | None) -> str | None:
    if not signal:
        return None
    try:
        return signals.Signals(signal).name
    except ValueError:
        return f"signal {signal}"


def how(cause: Cause) -> str:
    """`exit code 1`, `killed by SIGKILL (exit code 137)`, `lost with its node`, ..."""
    if cause.reason == NODE_LOST:
        return "lost with its node"
    if cause.reason == LAUNCH_FAILED and cause.message and cause.exit_code is None:
        return f"could not be started: {cause.message}"
    code = "unknown" if cause.exit_code is None else str(cause.exit_code)
    if cause.signal:
        return f"killed by {signal_name(cause.signal)} (exit code {code})"
    return f"exit code {code}"


def summary(cause: Cause) -> str:
    """One line: `service_train_node2 on node2 at 07:52:03: exit code 1 (Error); see LOG`."""
    stamp = time.strftime("%H:%M:%S", time.localtime(cause.at))
    return (
        f"{cause.instance} on {cause.node} at {stamp}: {how(cause)} ({cause.reason}); "
        f"see {cause.log}"
    )


def with_first_failure(reason: str, cause: Cause | None) -> str:
    """A failed job's reason, naming its first failure in full when the reason names
    another instance. One that names it already says its exit and log: only a class its
    exit code does not tell (OOMKilled, LivenessFailed) is added, with the time. A node's
    loss is one failure, whichever of its instances was reported first."""
    if cause is None:
        return reason
    if cause.reason == NODE_LOST and "lost" in reason and _names(reason, cause.node):
        return reason
    if _names(reason, cause.instance):
        if cause.reason not in REPORTED:
            return reason
        stamp = time.strftime("%H:%M:%S", time.localtime(cause.at))
        name = signal_name(cause.signal)
        return f"{reason}; first failure at {stamp}: {cause.reason}" + (
            f" ({name})" if name else ""
        )
    return f"{reason}; first failure: {summary(cause)}"


def _names(text: str, word: str) -> bool:
    """`text` names `word` whole (service_x_node3 is not service_x_node30)."""
    return re.search(rf"\b{re.escape(word)}\b", text) is not None


def cause_doc(cause: Cause | None) -> CauseDoc | None:
    if cause is None:
        return None
    return {
        "instance": cause.instance,
        "node": cause.node,
        "attempt": cause.attempt,
        "at": round(cause.at, 3),
        "reason": cause.reason,
        "exit_code": cause.exit_code,
        "signal": cause.signal,
        "signal_name": signal_name(cause.signal),
        "message": cause.message,
        "log": cause.log,
        "log_offset": cause.log_offset,
        "summary": summary(cause),
    }


def kept_history(history: Sequence[ExitRecord]) -> list[ExitRecord]:
    """The exits state.json keeps of one instance: the last `HISTORY_KEPT`, and its first
    failure on top when that is older, however many restarts followed it."""
    recent = list(history[-HISTORY_KEPT:])
    if len(history) <= HISTORY_KEPT:
        return recent
    first = next((h for h in history if h.get("reason")), None)
    if first is None or first in recent:
        return recent
    return [first, *recent[1:]]


def restored_cause(doc: object) -> Cause | None:
    """Adoption: the first failure from state.json's `job.cause` (None if absent or torn)."""
    if not isinstance(doc, dict):
        return None
    try:
        return Cause(
            instance=str(doc["instance"]),
            node=str(doc["node"]),
            attempt=int(doc["attempt"]),
            at=float(doc["at"]),
            reason=str(doc["reason"]),
            exit_code=doc.get("exit_code"),
            signal=doc.get("signal"),
            message=str(doc.get("message", "")),
            log=str(doc["log"]),
            log_offset=int(doc.get("log_offset", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None
