"""A scripted backend for controller tests: launches nothing, exits when told to.

Behaviour, not imitation: a launch records the spec and returns a pid; `exit(name, code)`
reports an exit; SIGTERM ends an attempt with 143 unless the instance is told to ignore it;
SIGKILL always ends it with 137. It declares no capabilities: nothing is adoptable, there is
no time limit, and its nodes cannot be lost on request (`lose(name)` reports one loss instead).
"""

from __future__ import annotations

import signal as signals

from srtr.backends.base import (
    Capabilities,
    Identity,
    LaunchError,
    LaunchSpec,
    Listener,
    NodeInfo,
    NodeLostError,
    Observation,
    ObservationKind,
)


class FakeBackend:
    name = "fake"
    capabilities = Capabilities()
    owns_allocation = False

    def __init__(self, node_count: int = 4) -> None:
        self._nodes = [NodeInfo(f"node{k}", f"127.0.0.{k + 1}") for k in range(1, node_count + 1)]
        self._listener: Listener | None = None
        self.launches: list[LaunchSpec] = []
        self.signals: list[tuple[str, int]] = []
        self.live: dict[str, LaunchSpec] = {}
        self.ignore_term: set[str] = set()
        self.fail_launch: set[str] = set()
        self.down: set[str] = set()  # nodes lost by `node_down`: nothing starts there
        # Programs the nodes lack (`has_program`), and every program asked about.
        self.missing_programs: set[str] = set()
        self.looked: list[tuple[str, str]] = []
        self.walltime_end: float | None = None  # `end_time`, with `capabilities.walltime`
        self._pid = 1000

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    async def launch(self, spec: LaunchSpec) -> int:
        if spec.node in self.down:
            raise NodeLostError(f"cannot start {spec.name!r}: node {spec.node} is DOWN")
        if spec.name in self.fail_launch:
            raise LaunchError(f"cannot start {spec.argv[0]!r}: scripted failure")
        self.launches.append(spec)
        self.live[spec.name] = spec
        self._pid += 1
        return self._pid

    def exit(self, name: str, code: int, signum: int | None = None, reason: str = "") -> None:
        """Report that the live attempt of `name` ended with `code` (and `reason`, as a
        backend that saw the OOM killer reports it)."""
        spec = self.live.pop(name)
        assert self._listener is not None
        self._listener(
            Observation(
                kind=ObservationKind.EXITED,
                name=name,
                attempt=spec.attempt,
                exit_code=code,
                signal=signum,
                reason=reason,
            )
        )

    def lose(self, name: str, *, fenced_in: float | None = None) -> None:
        """Report that the live attempt of `name` was lost with its node (`fenced_in`: the
        seconds its cut-off node may still run it, as the agent backend says)."""
        spec = self.live.pop(name)
        assert self._listener is not None
        self._listener(
            Observation(
                kind=ObservationKind.LOST,
                name=name,
                attempt=spec.attempt,
                message=f"node {spec.node} is DOWN",
                extra={} if fenced_in is None else {"fenced_in": f"{fenced_in:.3f}"},
            )
        )

    def node_down(self, node: str, *, fenced_in: float | None = None) -> None:
        """Lose `node` as the agent backend does: every live attempt there is LOST, and a
        launch there fails from now on (`NodeLostError`)."""
        self.down.add(node)
        for name in [n for n, spec in self.live.items() if spec.node == node]:
            self.lose(name, fenced_in=fenced_in)

    async def signal(self, name: str, signum: int) -> None:
        self.signals.append((name, signum))
        if name not in self.live:
            return
        if signum == signals.SIGKILL:
            self.exit(name, 128 + signum, signum)
        elif signum == signals.SIGTERM and name not in self.ignore_term:
            self.exit(name, 128 + signum, signum)

    def running(self) -> set[str]:
        return set(self.live)

    def identity(self, name: str) -> Identity | None:
        return None

    async def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        return False

    async def end_time(self) -> float | None:
        return self.walltime_end

    def has_program(self, what: str, name: str) -> bool:
        self.looked.append((what, name))
        return name not in self.missing_programs

    def lose_node(self, node: str) -> list[str]:
        raise ValueError(f"the {self.name} backend has no simulated nodes to lose")

    async def close(self) -> None:
        for name in list(self.live):
            self.exit(name, 137, signals.SIGKILL)

    def launched(self, name: str) -> int:
        return sum(1 for s in self.launches if s.name == name)
