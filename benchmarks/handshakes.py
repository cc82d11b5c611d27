"""The cost of TLS on the agent channel: 1,024 agents joining, encrypted and in the clear.

The controller's end (`channel.AgentServer`, TLS 1.3 through `tls_bytes.TlsBytes`, the job's
EC P-256 certificate) runs here, in the harness process; one hollow process (the real agent
code, 1,024 times, `python -m srtr.backends.agent.hollow`) dials it. Each agent does the TLS
handshake, pins the certificate, then the token's challenge/hello/welcome. Figures: the
controller's CPU seconds (`time.process_time` of this process) and the wall time until all
1,024 are admitted, with TLS and without it (the baseline); the difference is the
handshakes' cost to the controller. The agents' side (the hollow process) pays its own half.
Then, all joined and idle (a heartbeat a second each, read in batches as in a job), the
controller's CPU over IDLE seconds, TLS against the clear: what decrypting 1,024 heartbeats
a second costs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import Context, Figure, raise_nofile

TOKEN = "bench-token"
IDLE = 10.0


class Count:
    """A channel Handler that admits every node and counts them."""

    def __init__(self, expected: int) -> None:
        self.joined = 0
        self.expected = expected

    def connected(self, conn: object) -> None:
        self.joined += 1

    def received(self, conn: object, message: object) -> None:
        return None

    def gone(self, conn: object, why: str, *, silent: bool = False) -> None:
        return None

    def refuse(self, node: str) -> str | None:
        return None

    def awaiting(self) -> bool:
        # While they join, read at once (the figure is the handshakes, not the batching
        # window); then in batches, as a job's controller reads its heartbeats.
        return self.joined < self.expected


async def join(where: Path, nodes: int, encrypted: bool) -> tuple[float, float, float]:
    """(controller CPU seconds, wall seconds) until `nodes` hollow agents are admitted, and
    the controller's CPU % of one core while they are idle."""
    from srtr.backends.agent import protocol as p
    from srtr.backends.agent.channel import AgentServer
    from srtr.net import certs, tls

    cert = certs.create(where / "job.crt", where / "job.key")
    handler = Count(nodes)
    server = AgentServer(TOKEN, handler, tls=cert.server_context() if encrypted else None)
    host, port = await server.start("127.0.0.1")
    env = {**os.environ, p.TOKEN_ENV: TOKEN}
    if encrypted:
        env[tls.FINGERPRINT_ENV] = cert.fingerprint
    names = ",".join(f"n{k}" for k in range(nodes))
    argv = [sys.executable, "-m", "srtr.backends.agent.hollow", "--controller", f"{host}:{port}"]
    log = open(where / f"hollow-{encrypted}.log", "w")  # noqa: ASYNC230
    # Started before the clock: a blocking fork here costs the figure nothing.
    hollow = subprocess.Popen(  # noqa: ASYNC220
        [*argv, "--nodes", names], env=env, stdout=log, stderr=log
    )
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        while handler.joined < nodes:
            if hollow.poll() is not None:
                raise RuntimeError(f"the hollow process exited {hollow.returncode}")
            if time.perf_counter() - wall > 300:
                raise TimeoutError(f"{handler.joined}/{nodes} joined in 300 s")
            await asyncio.sleep(0.01)
        joined = time.process_time() - cpu, time.perf_counter() - wall
        await asyncio.sleep(2.0)  # the last welcomes and first heartbeats settle
        idle = time.process_time()
        await asyncio.sleep(IDLE)
        return (*joined, (time.process_time() - idle) / IDLE * 100)
    finally:
        hollow.kill()
        hollow.wait()
        log.close()
        await server.close()


def run(ctx: Context) -> list[Figure]:
    nodes = 256 if ctx.quick else 1024
    raise_nofile()
    where = ctx.dir("handshakes")
    clear_cpu, clear_wall, clear_idle = asyncio.run(join(where, nodes, encrypted=False))
    tls_cpu, tls_wall, tls_idle = asyncio.run(join(where, nodes, encrypted=True))
    per = (tls_cpu - clear_cpu) / nodes * 1000
    ctx.log(f"handshakes: clear {clear_cpu:.2f} s CPU / {clear_wall:.2f} s")
    ctx.log(f"handshakes: TLS {tls_cpu:.2f} s CPU / {tls_wall:.2f} s")
    return [
        Figure(
            "handshakes",
            f"{nodes} agents join over TLS: controller CPU",
            tls_cpu,
            "s",
            baseline=clear_cpu,
            baseline_label="in the clear",
        ),
        Figure(
            "handshakes",
            f"{nodes} agents join over TLS: wall",
            tls_wall,
            "s",
            baseline=clear_wall,
            baseline_label="in the clear",
        ),
        Figure("handshakes", "controller CPU per TLS handshake", per, "ms"),
        Figure(
            "handshakes",
            f"{nodes} agents idle over TLS: controller CPU ({IDLE:.0f}s)",
            tls_idle,
            "%",
            baseline=clear_idle,
            baseline_label="in the clear",
            note="% of one core: the channel alone, no job",
        ),
    ]
