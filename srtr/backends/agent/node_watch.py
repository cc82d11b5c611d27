"""The node agent's probe loops: probes of its instances, run here, reporting transitions only.

As the kubelet does: the controller sends one `Watch` per probe (a liveness probe, or a
readiness probe after its gate), the agent runs it every interval on the node, and sends a
`Health` message only when it changes: failing once `failure_threshold` attempts failed in a
row, passing again at the next pass. So a job with a probe on every instance of a thousand
nodes costs the controller nothing while they are healthy. A liveness loop ends once it
reported a failure: the controller stops the instance. Every loop of an instance ends with
its attempt (its exit, its next launch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from srtr.backends.agent import protocol as p
from srtr.resources.objects import ProbeSpec

log = logging.getLogger("srtr.agent")


class Probes(Protocol):
    """Runs probe attempts on the node (`prober.ProbeRunner`, or simulated)."""

    def forget(self, name: str) -> None: ...
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
    ) -> tuple[bool, str]: ...


class Watches:
    """The probe loops of one node's instances, one task per (instance, kind)."""

    def __init__(self, node: str, probes: Probes, send: Callable[[p.Message], None]) -> None:
        self.node = node
        self._probes = probes
        self._send = send
        self._loops: dict[tuple[str, str], asyncio.Task[None]] = {}

    def watch(self, request: p.Watch) -> None:
        key = (request.name, request.kind)
        old = self._loops.pop(key, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._loop(request))
        self._loops[key] = task
        task.add_done_callback(lambda done: self._done(key, done))

    def forget(self, name: str) -> None:
        """The instance's attempt ended (or a new one begins): its loops end."""
        for key in [k for k in self._loops if k[0] == name]:
            self._loops.pop(key).cancel()

    def close(self) -> None:
        for task in self._loops.values():
            task.cancel()
        self._loops.clear()

    def __len__(self) -> int:
        return len(self._loops)

    def _done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._loops.get(key) is task:
            del self._loops[key]

    async def _loop(self, w: p.Watch) -> None:
        await asyncio.sleep(w.delay)
        failures, failing = 0, False
        while True:
            ok, message = await self._attempt(w)
            failures = 0 if ok else failures + 1
            if not failing and failures >= w.probe.failure_threshold:
                failing = True
                self._send(p.Health(w.name, w.attempt, w.kind, False, failures, message))
                if w.kind == "liveness":
                    return  # the controller stops the instance now
            elif failing and ok:
                failing = False
                self._send(p.Health(w.name, w.attempt, w.kind, True, 0, message))
            await asyncio.sleep(w.probe.interval_seconds)

    async def _attempt(self, w: p.Watch) -> tuple[bool, str]:
        try:
            return await self._probes.check(
                w.name,
                w.probe,
                node_ip=w.node_ip,
                attempt=w.attempt,
                log_path=Path(w.log_path),
                log_offset=w.log_offset,
                files_dir=Path(w.files_dir),
                env=w.env,
                liveness=w.kind == "liveness",
            )
        except Exception as exc:  # a probe bug is a failed probe, not a dead agent
            log.exception("agent %s: probe of %s failed", self.node, w.name)
            return False, f"probe error on {self.node}: {exc!r}"
