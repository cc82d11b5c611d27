"""The agent backend with real agent processes on simulated local nodes: launches, exits,
signals, probes on the node, the channel's authentication, node loss (a killed agent, a
silent one) and a close that leaves nothing behind."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from srtr.backends.agent import channel
from srtr.backends.agent import protocol as p
from srtr.backends.agent.backend import MAX_RESPAWNS, AgentBackend, AgentProber
from srtr.backends.agent.starters import LocalAgents
from srtr.backends.base import (
    LaunchError,
    LaunchSpec,
    NodeInfo,
    NodeLostError,
    Observation,
    ObservationKind,
)
from srtr.net import certs
from srtr.resources.objects import InstanceKind, InstanceSpec, ProbeKind, ProbeSpec, RestartSpec
from tests.support.e2e_util import cmdlines_with, processes_with
from tests.support.e2e_util import wait_for as sync_wait_for
from tests.support.e2e_util import wait_for_async as wait_for

pytestmark = pytest.mark.e2e  # real agents and processes on the simulated nodes


class Link:
    """The agents' own network, joined to the controller's by a veth pair that can go down
    as a cable does: `cut()` sets the controller's end down (no FIN, no RST, and no TCP
    acknowledgement either way: what the agents' lease watches), `mend()` brings it back.
    Needs root and `ip` (iproute2), as the SLURM test cluster does."""

    _made = 0

    def __init__(self) -> None:
        Link._made += 1
        tag = f"{os.getpid()}{Link._made}"[-9:]
        self.netns = f"srtr-link-{tag}"
        self._host_end = f"sl{tag}h"
        self._agent_end = f"sl{tag}a"
        # A /30 of 10.251.0.0/16 of its own: the controller's end .1, the agents' .2.
        slot = (os.getpid() * 8 + Link._made) % 16384
        net = f"10.251.{slot // 64}.{(slot % 64) * 4}"
        self.host = _plus(net, 1)  # where the controller listens
        self._agent_ip = _plus(net, 2)
        self.up = False

    @property
    def under(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def start(self) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self._host_end, "type", "veth", "peer", "name", self._agent_end)
        _ip("link", "set", self._agent_end, "netns", self.netns)
        _ip("addr", "add", f"{self.host}/30", "dev", self._host_end)
        _ip("-n", self.netns, "addr", "add", f"{self._agent_ip}/30", "dev", self._agent_end)
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("-n", self.netns, "link", "set", self._agent_end, "up")
        self.mend()

    def cut(self) -> None:
        _ip("link", "set", self._host_end, "down")
        self.up = False

    def mend(self) -> None:
        _ip("link", "set", self._host_end, "up")
        self.up = True

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self._host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def _plus(address: str, n: int) -> str:
    head, last = address.rsplit(".", 1)
    return f"{head}.{int(last) + n}"


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        node_count: int,
        *,
        respawn: bool = False,
        link: Link | None = None,
        lease: float | None = None,
        tls: bool = False,
    ) -> None:
        """`tls`: the channel is TLS with a job certificate, as `srtr up` runs it."""
        self.run_dir = tmp_path / f"run-{uuid.uuid4().hex[:8]}"
        (self.run_dir / "logs").mkdir(parents=True)
        self.marker = f"SRTR_RUN_DIR={self.run_dir.resolve()}\0"
        self.token = uuid.uuid4().hex
        self.nodes = [NodeInfo(f"node{k}", f"127.0.0.{k + 1}") for k in range(1, node_count + 1)]
        under = [] if link is None else link.under
        starter = LocalAgents(self.nodes, self.run_dir, respawn=respawn, under=under)
        self.cert = certs.for_job(self.run_dir) if tls else None
        more: dict[str, Any] = {} if lease is None else {"lease": lease}
        if link is not None:
            link.start()
            more["host"] = link.host
        self.backend = AgentBackend(
            self.nodes,
            starter,
            token=self.token,
            tls=self.cert.server_context() if self.cert else None,
            fingerprint=self.cert.fingerprint if self.cert else "",
            **more,
        )
        self.observations: list[Observation] = []
        self.backend.set_listener(self.observations.append)

    def spec(self, name: str, argv: list[str], *, node: int = 1, **kw: Any) -> LaunchSpec:
        info = self.nodes[node - 1]
        env = {"SRTR_RUN_DIR": str(self.run_dir.resolve()), **kw.pop("env", {})}
        return LaunchSpec(
            name=name,
            node=info.name,
            node_ip=info.ip,
            argv=tuple(argv),
            env=env,
            log_path=self.run_dir / "logs" / f"{name}.out",
            **kw,
        )

    async def launch(self, name: str, argv: list[str], **kw: Any) -> int:
        return await self.backend.launch(self.spec(name, argv, **kw))

    def seen(self, name: str, kind: ObservationKind) -> list[Observation]:
        return [o for o in self.observations if o.name == name and o.kind is kind]

    async def wait_seen(
        self, name: str, kind: ObservationKind, within: float = 10.0
    ) -> Observation:
        await wait_for(lambda: self.seen(name, kind), within, f"{kind} of {name}")
        return self.seen(name, kind)[-1]

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / f"{name}.out"
        return path.read_text() if path.exists() else ""

    async def close_and_check(self) -> None:
        await self.backend.close()
        assert self.backend.running() == set()
        await wait_for(lambda: not processes_with(self.marker), 10, "every process to be gone")


def run(
    tmp_path: Path,
    body: Callable[[Harness], Awaitable[None]],
    node_count: int = 2,
    *,
    respawn: bool = False,
    link: Link | None = None,
    lease: float | None = None,
    tls: bool = False,
) -> None:
    async def main() -> None:
        harness = Harness(tmp_path, node_count, respawn=respawn, link=link, lease=lease, tls=tls)
        try:
            await body(harness)
        finally:
            try:
                await harness.close_and_check()
            finally:
                if link is not None:
                    link.close()

    # The agents' sockets read twice a second, not once a `READ_PERIOD`: the tests wait on
    # the heartbeats the controller read (`_beats`).
    with mock.patch.object(channel, "READ_PERIOD", 0.5):
        asyncio.run(main())


def test_exit_codes_signals_and_logs_come_back_from_the_agent(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("three", ["bash", "-c", "echo on $SRTR_NODE; exit 3"], node=2)
        assert (await h.wait_seen("three", ObservationKind.EXITED)).exit_code == 3
        assert h.seen("three", ObservationKind.EXITED)[-1].pid == pid
        assert h.log("three") == "on node2\n"
        await h.launch("sleeper", ["sleep", "1000"])
        assert h.backend.running() == {"sleeper"}
        await h.backend.signal("sleeper", signal.SIGTERM)
        done = await h.wait_seen("sleeper", ObservationKind.EXITED)
        assert (done.exit_code, done.signal) == (143, signal.SIGTERM)
        await h.launch("sleeper", ["sleep", "1000"], attempt=1)
        await h.backend.signal("sleeper", signal.SIGKILL)
        await wait_for(
            lambda: [o for o in h.seen("sleeper", ObservationKind.EXITED) if o.attempt == 1],
            what="attempt 1 to exit",
        )
        assert "attempt 1 starting on node1" in h.log("sleeper")

    run(tmp_path, body)


def test_a_launch_that_cannot_start_is_a_launch_error(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        try:
            await h.launch("nope", ["/nonexistent/srtr-binary"])
        except LaunchError as exc:
            assert "No such file or directory" in str(exc)
        else:
            raise AssertionError("expected a LaunchError")
        await h.launch("busy", ["sleep", "1000"])
        try:
            await h.launch("busy", ["sleep", "1000"], attempt=1)
        except LaunchError as exc:
            assert "has not exited yet" in str(exc)
        else:
            raise AssertionError("expected a LaunchError")

    run(tmp_path, body)


def test_a_secret_reaches_the_instance_and_no_command_line(tmp_path: Path) -> None:
    secret = f"hf_{uuid.uuid4().hex},x y'z$"

    async def body(h: Harness) -> None:
        argv = ["bash", "-c", 'test "$HF_TOKEN" = "$EXPECTED" && echo same; exec sleep 1000']
        await h.launch("holder", argv, env={"HF_TOKEN": secret, "EXPECTED": secret})
        await wait_for(lambda: "same" in h.log("holder"), what="the instance to see its secret")
        assert cmdlines_with(secret) == []
        assert cmdlines_with(h.token) == []  # nor the channel's token

    run(tmp_path, body)


def test_the_token_never_reaches_an_instance(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.launch("env", ["bash", "-c", "env; exit 0"])
        await h.wait_seen("env", ObservationKind.EXITED)
        assert h.token not in h.log("env")
        assert p.TOKEN_ENV not in h.log("env")
        assert "SRTR_INSTANCE=env" in h.log("env")

    run(tmp_path, body)


def test_readiness_probes_run_on_the_node(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:

        prober = AgentProber(h.backend)
        await h.launch(
            "web",
            ["bash", "-c", "echo warming; sleep 1; echo ready now; exec sleep 1000"],
            node=2,
        )
        spec = InstanceSpec(
            name="web",
            service="web",
            kind=InstanceKind.SERVICE,
            type="custom",
            index=0,
            node="node2",
            node_ip="127.0.0.3",
            argv=("x",),
            env=(),
            log=str(Path("logs") / "web.out"),
            stage="s",
            shutdown_tier=0,
            stop_grace_seconds=1.0,
            critical=False,
            terminal=False,
            restart=RestartSpec("always", 1, 1, 1, 1, 1),
            probe=ProbeSpec(ProbeKind.LOG, 10.0, 0.05, pattern="ready now"),
        )

        class Status:
            attempt = 0
            log_offset = 0

        results: list[tuple[bool, str]] = []

        async def ready() -> bool:
            results.append(await prober.check(spec, Status(), h.run_dir))
            return results[-1][0]

        for _ in range(200):  # the probe's own cadence: one attempt per interval
            if await ready():
                break
            await asyncio.sleep(0.05)
        assert results[-1][0], results
        assert not results[0][0]  # not ready while it was warming up
        tcp = ProbeSpec(ProbeKind.TCP, 10.0, 0.2, port=1)
        ok, message = await prober.check(dataclasses.replace(spec, probe=tcp), Status(), h.run_dir)
        assert not ok and "127.0.0.3:1" in message

    run(tmp_path, body)


def test_a_killed_agent_loses_its_node_and_takes_its_instances(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("victim", ["sleep", "1000"], node=2)
        await h.launch("bystander", ["sleep", "1000"], node=1)
        agent = h.backend.agent_pid("node2")
        assert agent is not None
        started = time.monotonic()
        os.kill(agent, signal.SIGKILL)
        lost = await h.wait_seen("victim", ObservationKind.LOST, within=3.0)
        assert time.monotonic() - started < 3.0
        assert lost.pid == pid and "node2" in lost.message
        await wait_for(lambda: not _alive(pid), 5, "the victim to die with its agent")
        assert h.backend.running() == {"bystander"}
        try:
            await h.launch("victim", ["sleep", "1000"], node=2, attempt=1)
        except NodeLostError as exc:  # lost with its node: not an exit its policy retries
            assert "lost" in str(exc)
        else:
            raise AssertionError("a lost node must refuse launches")

    run(tmp_path, body)


def test_a_dead_agent_is_replaced_until_its_nodes_budget_is_spent(tmp_path: Path) -> None:
    """Where the starter can (SLURM: a one-node step; here, LocalAgents(respawn=True)), a
    killed agent's node lives on: its instances are reported killed with it, a new agent
    comes, launches go through it; the death after MAX_RESPAWNS loses the node."""

    async def body(h: Harness) -> None:
        await h.launch("victim", ["sleep", "1000"], node=2)
        await h.launch("bystander", ["sleep", "1000"], node=1)
        for attempt in range(1, MAX_RESPAWNS + 1):
            agent = h.backend.agent_pid("node2")
            assert agent is not None
            os.kill(agent, signal.SIGKILL)
            await wait_for(
                lambda n=attempt: len(h.seen("victim", ObservationKind.EXITED)) == n,
                10,
                "the victim reported killed with its agent",
            )
            exited = h.seen("victim", ObservationKind.EXITED)[-1]
            assert exited.signal == 9 and "with its agent" in exited.message, exited
            await h.launch("victim", ["sleep", "1000"], node=2, attempt=attempt)
            assert h.backend.agent_pid("node2") not in (None, agent)
        os.kill(h.backend.agent_pid("node2") or 0, signal.SIGKILL)
        lost = await h.wait_seen("victim", ObservationKind.LOST)
        assert "node2" in lost.message
        assert h.backend.running() == {"bystander"}
        assert not h.seen("bystander", ObservationKind.EXITED)
        try:
            await h.launch("victim", ["sleep", "1000"], node=2, attempt=MAX_RESPAWNS + 1)
        except NodeLostError as exc:
            assert "lost" in str(exc)
        else:
            raise AssertionError("a lost node must refuse launches")

    run(tmp_path, body, respawn=True)


def test_a_silent_agent_loses_its_node_within_three_seconds(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("victim", ["sleep", "1000"], node=2)
        agent = h.backend.agent_pid("node2")
        assert agent is not None
        os.kill(agent, signal.SIGSTOP)  # alive, connected, but silent: a hung node
        try:
            started = time.monotonic()
            lost = await h.wait_seen("victim", ObservationKind.LOST, within=3.5)
            assert time.monotonic() - started < 3.0
            assert "silent" in lost.message
        finally:
            os.kill(agent, signal.SIGCONT)
        # Woken up, it reads the Shutdown it was sent and kills what it started.
        await wait_for(lambda: not _alive(pid), 5, "the victim to be killed by its agent")

    run(tmp_path, body)


def test_a_launch_in_flight_to_a_node_lost_meanwhile_fails_as_lost(tmp_path: Path) -> None:
    """A silent agent that has not answered a launch: once its node is lost, the launch
    fails as lost (not an exit its restart policy retries), fenced as its instances are:
    the agent may have started it before it went silent."""

    async def body(h: Harness) -> None:
        await h.launch("victim", ["sleep", "1000"], node=2)
        agent = h.backend.agent_pid("node2")
        assert agent is not None
        os.kill(agent, signal.SIGSTOP)
        try:
            with pytest.raises(NodeLostError, match="was lost while we waited") as caught:
                await h.launch("late", ["sleep", "1000"], node=2)
            assert caught.value.fenced_in is not None and caught.value.fenced_in > 0
            lost = await h.wait_seen("victim", ObservationKind.LOST)
            assert caught.value.fenced_in >= float(lost.extra["fenced_in"]) - 0.1
        finally:
            os.kill(agent, signal.SIGCONT)

    run(tmp_path, body)


def test_a_cut_off_agent_fences_its_instances_before_the_controller_counts_them_gone(
    tmp_path: Path,
) -> None:
    """The link goes down (no FIN, no RST): the controller loses the node after its silence,
    and says by when the node's agent will have stopped its instances; the agent, its
    heartbeats no longer acknowledged, SIGTERMs them at the end of its lease and SIGKILLs the
    one that ignores it after its grace. By the controller's deadline both are gone."""
    link = Link()

    async def body(h: Harness) -> None:
        polite = await h.launch("polite", ["sleep", "1000"], stop_grace_seconds=1.0)
        stubborn = await h.launch(
            "stubborn", ["bash", "-c", "trap '' TERM; exec sleep 1000"], stop_grace_seconds=1.0
        )
        # Heartbeats got through: the lease now runs from one the controller's host took.
        await wait_for(lambda: _beats(h) >= 2, 5, "heartbeats")
        link.cut()
        lost = await h.wait_seen("stubborn", ObservationKind.LOST, within=10)
        deadline = time.monotonic() + float(lost.extra["fenced_in"])
        assert "stops it itself" in lost.message
        assert _alive(polite) and _alive(stubborn)  # it cannot know yet: not before its lease
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))  # the controller's rule
        assert not _alive(polite) and not _alive(stubborn)
        log = _agent_log(h)
        assert "no word from the controller" in log and "fencing" in log, log
        assert "fenced stubborn still running 1s after SIGTERM: SIGKILL" in log, log

    run(tmp_path, body, node_count=1, link=link, lease=4.0)


def test_a_stalled_controller_keeps_its_agents_and_their_work(tmp_path: Path) -> None:
    """The controller's event loop is blocked for longer than the lease and the silence (a
    huge state.json write, a debugger): its host still acknowledges the heartbeats, so no
    agent fences, and the controller, once it runs again, counts its own stall as no one's
    silence: nothing is lost, nothing restarts."""

    async def body(h: Harness) -> None:
        pid = await h.launch("worker", ["sleep", "1000"], stop_grace_seconds=1.0)
        await wait_for(lambda: _beats(h) >= 2, 5, "heartbeats")
        _stall(2.5 + 2.0)  # past the lease and the silence (both 2.5 s)
        before = _beats(h)
        await wait_for(lambda: _beats(h) > before, 5, "a heartbeat after the stall")
        assert _alive(pid)
        assert not h.seen("worker", ObservationKind.LOST)
        assert not h.seen("worker", ObservationKind.EXITED)
        assert "fencing" not in _agent_log(h)

    run(tmp_path, body, node_count=1, lease=2.5)


def test_a_fence_ends_when_the_link_comes_back_and_the_controller_hears_its_exits(
    tmp_path: Path,
) -> None:
    """The link goes down while the controller is stalled, so it cannot count the silence:
    the agent fences (its instance gets SIGTERM); the link comes back before the controller
    runs again, the agent's heartbeats are acknowledged again and the fence is over. The
    controller, awake, hears the fenced exit queued on the connection, has lost no node, and
    can launch there again."""
    link = Link()

    async def body(h: Harness) -> None:
        pid = await h.launch("victim", ["sleep", "1000"], stop_grace_seconds=1.0)
        await wait_for(lambda: _beats(h) >= 2, 5, "heartbeats")
        # The controller's loop stays blocked from here to the mend: these waits are sync.
        link.cut()
        sync_wait_for(lambda: "fencing" in _agent_log(h), 15, "the agent to fence")
        sync_wait_for(lambda: not _alive(pid), 5, "the fenced victim to exit")
        link.mend()
        sync_wait_for(lambda: "the fence is over" in _agent_log(h), 20, "the fence to end")
        exited = await h.wait_seen("victim", ObservationKind.EXITED, within=10)
        assert (exited.signal, exited.pid) == (signal.SIGTERM, pid)
        assert "fenced: no word from the controller" in exited.message
        assert not h.seen("victim", ObservationKind.LOST)
        again = await h.launch("victim", ["sleep", "1000"], attempt=1)
        assert _alive(again)

    run(tmp_path, body, node_count=1, link=link, lease=2.5)


def _stall(seconds: float) -> None:
    """Block the event loop, the controller's with it, as a stalled controller is."""
    time.sleep(seconds)


def _beats(h: Harness) -> int:
    """The fewest heartbeats the controller has seen from any of its agents."""
    server = h.backend._server
    conns = [] if server is None else list(server.connections())
    return min((c.beats for c in conns), default=0)


def _agent_log(h: Harness, node: int = 1) -> str:
    return (h.run_dir / "logs" / f"agent-node{node}.log").read_text()


def test_lose_node_kills_the_agent_and_reports_its_instances(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("victim", ["sleep", "1000"], node=2)
        assert h.backend.lose_node("node2") == ["victim"]
        assert h.seen("victim", ObservationKind.LOST) or await h.wait_seen(
            "victim", ObservationKind.LOST
        )
        await wait_for(lambda: not _alive(pid), 5, "the victim to die with its agent")

    run(tmp_path, body)


def test_a_connection_without_the_token_is_refused(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.launch("x", ["sleep", "1000"])
        address = h.backend.address
        assert address is not None
        reader, writer = await asyncio.open_connection(*address)
        challenge = p.decode(await reader.readline())
        assert isinstance(challenge, p.Challenge)
        forged = p.proof("not-the-token", "agent", challenge.nonce, "node2")
        writer.write(p.encode(p.Hello(node="node2", pid=1, nonce="n", proof=forged)))
        assert await reader.read() == b""  # closed, nothing said
        writer.close()
        # An agent with the wrong token gives up (exit 3), and node1's agent is unharmed.
        env = {**os.environ, p.TOKEN_ENV: "wrong"}
        argv = [sys.executable, "-m", "srtr.backends.agent.node"]
        argv += ["--controller", f"{address[0]}:{address[1]}", "--node", "node2"]
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 3, done.stderr
        assert "not our controller" in done.stderr or "refused" in done.stderr
        assert h.backend.agent_pid("node1") is not None and h.backend.running() == {"x"}

    run(tmp_path, body)


def test_a_second_agent_for_a_node_is_refused(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.launch("x", ["sleep", "1000"])
        address = h.backend.address
        assert address is not None
        env = {**os.environ, p.TOKEN_ENV: h.token}
        argv = [sys.executable, "-m", "srtr.backends.agent.node"]
        argv += ["--controller", f"{address[0]}:{address[1]}", "--node", "node1"]
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 3 and "has an agent already" in done.stderr, done.stderr
        assert h.backend.running() == {"x"}

    run(tmp_path, body)


def test_close_kills_everything_and_the_agents_leave(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pids = [
            await h.launch(f"s{k}", ["bash", "-c", "sleep 1000 & wait"], node=k) for k in (1, 2)
        ]
        agents = [h.backend.agent_pid(n) for n in ("node1", "node2")]
        await h.backend.close()
        assert {o.name for o in h.observations if o.kind is ObservationKind.EXITED} == {"s1", "s2"}
        for pid in [*pids, *agents]:
            assert pid is not None
            await wait_for(lambda pid=pid: not _alive(pid), 5, f"pid {pid} to be gone")

    run(tmp_path, body)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


RACE = """
name: race
services:
  - name: svc
    command: [sleep, "1000"]
    nodes: 2
"""


def test_a_teardown_during_a_launch_in_flight_stops_that_instance_too(tmp_path: Path) -> None:
    """The controllers await launches together (`launches_in_flight`): a Ctrl+C while the
    agent of node2 has not answered its launch yet (it is stopped) must neither end the job
    without that instance nor leave its process running once the agent answers."""
    from srtr.controllers import manager
    from srtr.controllers.context import Ctx
    from srtr.reconciler.clock import MonotonicClock
    from srtr.reconciler.workqueue import WorkQueue
    from srtr.resources.expand import local_allocation
    from srtr.resources.planning import plan_text_source
    from srtr.store.store import Store

    async def body(h: Harness) -> None:
        _, desired = plan_text_source(RACE, "recipe.yaml", local_allocation(2))
        late = next(s.name for s in desired.instances if s.node == "node2")
        clock = MonotonicClock()
        ctx = Ctx(
            store=Store(desired, clock),
            backend=h.backend,
            clock=clock,
            queue=WorkQueue(clock),
            prober=AgentProber(h.backend),
            run_dir=h.run_dir,
        )
        events: list[Any] = []
        ctx.store.subscribe_events(events.append)
        reconciled: list[str] = []
        ctx.on_reconciled = lambda key, _seconds, _depth: reconciled.append(key)
        stopped: list[int] = []
        launch = h.backend.launch

        async def held_launch(spec: LaunchSpec) -> int:
            if spec.name == late:  # its agent hears the Launch, and answers only once resumed
                await wait_for(lambda: h.backend.agent_pid(spec.node), 30, "node2's agent")
                stopped.append(h.backend.agent_pid(spec.node) or 0)
                os.kill(stopped[0], signal.SIGSTOP)
            return await launch(spec)

        h.backend.launch = held_launch  # type: ignore[method-assign]
        job = asyncio.create_task(manager.run(ctx))
        try:
            await wait_for(lambda: stopped and late in ctx.launches, 30, "the launch in flight")
            manager.request_stop(ctx, signal.SIGTERM)
            await wait_for(lambda: "teardown" in reconciled, 10, "the teardown's first look")
            assert not ctx.done.is_set()
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        async with asyncio.timeout(30):
            await job
        status = ctx.store.status[late]
        assert status.phase == "Stopped"
        assert [e["signal"] for e in status.history] == [signal.SIGTERM]  # the teardown's
        reasons = [e.reason for e in events if e.object in ("job", f"instance/{late}")]
        assert reasons.index("Launched") < reasons.index("Exited") < reasons.index("JobFailed")
        await wait_for(lambda: not processes_with(h.marker), 10, "every process to be gone")

    run(tmp_path, body)
