"""The controller's side of the agents' probe loops: who to tell of each watched probe.

`AgentBackend.watch` asks an agent to run a probe in a loop (`p.Watch`); the agent answers
only with transitions (`p.Health`, see `node_watch.py`). This keeps, per (instance, kind),
the attempt watched and the report to call, so that a transition of an older attempt (one
that crossed the instance's exit on the wire) is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.prober import probe_env
from srtr.resources.objects import InstanceSpec

# A watched probe's transition: (ok, failures in a row, message).
Report = Callable[[bool, int, str], None]
KINDS = ("liveness", "readiness")


class Watched:
    def __init__(self) -> None:
        self._reports: dict[tuple[str, str], tuple[int, Report]] = {}

    def request(
        self,
        spec: InstanceSpec,
        kind: str,
        *,
        attempt: int,
        log_offset: int,
        run_dir: Path,
        delay: float,
        report: Report,
    ) -> p.Watch | None:
        """The message that has the agent watch `spec`'s `kind` probe (None: it has none)."""
        probe = spec.liveness if kind == "liveness" else spec.probe
        if probe is None:
            return None
        self._reports[(spec.name, kind)] = (attempt, report)
        return p.Watch(
            name=spec.name,
            attempt=attempt,
            kind=kind,
            probe=probe,
            node_ip=spec.node_ip,
            log_path=str(run_dir / spec.log),
            log_offset=log_offset,
            files_dir=str(run_dir / "logs"),
            delay=delay,
            env=probe_env(spec, run_dir) if kind == "liveness" else {},
        )

    def health(self, message: p.Health) -> None:
        """An agent's transition: told to whoever watches that attempt."""
        watched = self._reports.get((message.name, message.kind))
        if watched is not None and watched[0] == message.attempt:
            watched[1](message.ok, message.failures, message.message)

    def exited(self, name: str) -> None:
        for kind in KINDS:
            self._reports.pop((name, kind), None)
