"""How the controller asks agents to probe their instances: one attempt at a time
(`probe`: the answer is the probe's result), or in a loop on the node that reports only
transitions (`watch`). A part of `AgentBackend`, which holds the nodes and their agents."""

from __future__ import annotations

from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.agent.probing import Status
from srtr.backends.agent.roster import Answers, LiveAttempts, NodeState
from srtr.backends.agent.watched import Report, Watched
from srtr.backends.base import LaunchError
from srtr.backends.prober import probe_env
from srtr.resources.objects import InstanceSpec


class ProbesOnAgents:
    """Mixed into `AgentBackend`: its nodes, live instances, waiting requests and watches."""

    _nodes: dict[str, NodeState]
    _live: LiveAttempts
    _answers: Answers
    _watched: Watched

    def on_agent(self, name: str) -> bool:
        return name in self._live

    async def probe(
        self,
        spec: InstanceSpec,
        attempt: int,
        log_offset: int,
        run_dir: Path,
        *,
        liveness: bool = False,
    ) -> tuple[bool, str]:
        """One probe attempt (readiness, or `liveness`), run by the agent of its node."""
        probe = spec.liveness if liveness else spec.probe
        assert probe is not None
        state = self._nodes[spec.node]
        if state.conn is None:
            return False, f"no agent on {spec.node}: {state.lost or state.failed or 'not yet'}"

        def request(seq: int) -> p.Message:
            return p.Probe(
                seq=seq,
                name=spec.name,
                attempt=attempt,
                probe=probe,
                node_ip=spec.node_ip,
                log_path=str(run_dir / spec.log),
                log_offset=log_offset,
                files_dir=str(run_dir / "logs"),
                env=probe_env(spec, run_dir) if liveness else {},
                liveness=liveness,
            )

        try:
            answer = await self._answers.ask(
                state.conn, request, max(10.0, 2 * probe.interval_seconds)
            )
        except TimeoutError:
            return False, f"the agent on {spec.node} did not answer the probe"
        except LaunchError as exc:
            return False, str(exc)
        assert isinstance(answer, p.ProbeResult)
        return answer.ok, answer.message

    def watch(
        self,
        spec: InstanceSpec,
        kind: str,
        status: Status,
        run_dir: Path,
        delay: float,
        report: Report,
    ) -> bool:
        """Have the agent of the instance's node run its `kind` probe and report its
        transitions (`watched.py`); False when no agent runs the instance."""
        state = self._nodes.get(spec.node)
        if spec.name not in self._live or state is None or state.conn is None:
            return False
        request = self._watched.request(
            spec,
            kind,
            attempt=status.attempt,
            log_offset=status.log_offset,
            run_dir=run_dir,
            delay=delay,
            report=report,
        )
        if request is not None:
            state.conn.send(request)
        return request is not None
