"""The node agent's probe loops (`node_watch.Watches`): they report transitions only, and a
`Watch`/`Health` pair survives the wire."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from srtr.backends.agent import protocol as p
from srtr.backends.agent.node_watch import Watches
from srtr.resources.objects import ProbeKind, ProbeSpec

PROBE = ProbeSpec(ProbeKind.EXEC, 1.0, 0.01, command=("check",), failure_threshold=2)


class Scripted:
    """Probe answers in turn (the last one repeats)."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.calls = 0
        self.liveness: list[bool] = []

    def forget(self, name: str) -> None:
        pass

    async def check(
        self,
        name: str,
        probe: ProbeSpec,
        *,
        node_ip: str,
        attempt: int,
        log_path: Path,
        log_offset: int,
        files_dir: Path,
        env: Mapping[str, str] | None = None,
        liveness: bool = False,
    ) -> tuple[bool, str]:
        self.liveness.append(liveness)
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return answer, f"attempt {self.calls}"


def watch(kind: str) -> p.Watch:
    return p.Watch("web", 0, kind, PROBE, "127.0.0.2", "/x/web.out", 0, "/x", 0.0, {"A": "1"})


async def until(predicate: object, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_readiness_loop_reports_only_its_transitions() -> None:
    async def body() -> None:
        sent: list[p.Message] = []
        probes = Scripted([True, True, False, True, False, False, False, True, True])
        watches = Watches("node1", probes, sent.append)
        watches.watch(watch("readiness"))
        await until(lambda: probes.calls >= 12)
        watches.close()
        health = [m for m in sent if isinstance(m, p.Health)]
        # one failure alone is below the threshold; two in a row flip it, a pass flips back
        assert [(h.ok, h.failures, h.message) for h in health] == [
            (False, 2, "attempt 6"),
            (True, 0, "attempt 8"),
        ]
        assert not any(probes.liveness)

    asyncio.run(body())


def test_liveness_loop_reports_its_failure_once_and_ends() -> None:
    async def body() -> None:
        sent: list[p.Message] = []
        probes = Scripted([False])
        watches = Watches("node1", probes, sent.append)
        watches.watch(watch("liveness"))
        await until(lambda: sent)
        await until(lambda: len(watches) == 0)
        assert probes.calls == 2 and all(probes.liveness)
        assert sent == [p.Health("web", 0, "liveness", False, 2, "attempt 2")]

    asyncio.run(body())


def test_forget_ends_an_instances_loops() -> None:
    async def body() -> None:
        probes = Scripted([True])
        watches = Watches("node1", probes, lambda m: None)
        watches.watch(watch("readiness"))
        watches.watch(watch("liveness"))
        assert len(watches) == 2
        watches.forget("web")
        assert len(watches) == 0
        calls = probes.calls
        await asyncio.sleep(0.05)
        assert probes.calls == calls

    asyncio.run(body())


def test_watch_and_health_round_trip() -> None:
    message = watch("liveness")
    again = p.decode(p.encode(message))
    assert again == message and isinstance(again, p.Watch)
    assert again.probe.command == ("check",) and again.env == {"A": "1"}
    health = p.Health("web", 3, "readiness", False, 3, "refused")
    assert p.decode(p.encode(health)) == health
