"""Readiness probes against real sockets on a node IP and real files."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from srtr.backends.probes import LogProbe, ProbeResult, probe_file, probe_http, probe_tcp

NODE_IP = "127.0.0.2"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, NODE_IP, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def free_port() -> int:
    """A port on NODE_IP that nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind((NODE_IP, 0))
        port: int = sock.getsockname()[1]
        return port


async def just_close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def health_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readline()
    while (await reader.readline()).strip():
        pass
    status = "200 OK" if request.split()[1] == b"/health" else "503 Service Unavailable"
    writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
    await writer.drain()
    writer.close()


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    writer.close()


async def garbage_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    writer.write(b"SSH-2.0-OpenSSH\r\n")
    await writer.drain()
    writer.close()


async def silent_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Reads until the client goes away and never answers.
    while await reader.read(1024):
        pass
    writer.close()


def test_tcp_connects_to_a_listener_and_reports_refusal() -> None:
    async def main() -> None:
        async with serving(just_close) as port:
            assert await probe_tcp(NODE_IP, port, 2.0) == ProbeResult(
                ok=True, message=f"tcp {NODE_IP}:{port}: connected"
            )
        port = free_port()
        assert await probe_tcp(NODE_IP, port, 2.0) == ProbeResult(
            ok=False, message=f"tcp {NODE_IP}:{port}: connection refused"
        )

    asyncio.run(main())


def test_a_tcp_probe_of_several_ports_needs_each_in_turn(tmp_path: Path) -> None:
    """mooncake-master's probe (S-40): 8700, 8701, 8702 in turn; the first closed one says."""
    from srtr.backends.prober import ProbeRunner
    from srtr.resources.objects import ProbeKind, ProbeSpec

    async def main() -> None:
        runner = ProbeRunner()
        closed = free_port()
        async with serving(just_close) as first, serving(just_close) as second:

            async def check(*more: int) -> tuple[bool, str]:
                spec = ProbeSpec(ProbeKind.TCP, 5.0, 0.5, port=first, more_ports=more)
                return await runner.check(
                    "m",
                    spec,
                    node_ip=NODE_IP,
                    attempt=1,
                    log_path=tmp_path / "m.out",
                    log_offset=0,
                    files_dir=tmp_path,
                )

            assert await check(second) == (True, f"tcp {NODE_IP}:{second}: connected")
            assert await check(closed, second) == (
                False,
                f"tcp {NODE_IP}:{closed}: connection refused",
            )

    asyncio.run(main())


def test_http_compares_the_status_code() -> None:
    async def main() -> None:
        async with serving(health_server) as port:
            ok = await probe_http(NODE_IP, port, "/health", 200, 2.0)
            assert ok == ProbeResult(ok=True, message=f"http://{NODE_IP}:{port}/health -> 200")
            sick = await probe_http(NODE_IP, port, "/sick", 200, 2.0)
            assert sick == ProbeResult(
                ok=False, message=f"http://{NODE_IP}:{port}/sick -> 503 (want 200)"
            )
            assert (await probe_http(NODE_IP, port, "/sick", 503, 2.0)).ok

    asyncio.run(main())


def test_http_failures_say_why() -> None:
    async def main() -> None:
        port = free_port()
        refused = await probe_http(NODE_IP, port, "/health", 200, 2.0)
        assert refused.message == f"http://{NODE_IP}:{port}/health: connection refused"
        async with serving(garbage_server) as port:
            garbage = await probe_http(NODE_IP, port, "/", 200, 2.0)
            assert not garbage.ok
            assert "not an HTTP status line" in garbage.message
        async with serving(hang_up) as port:
            closed = await probe_http(NODE_IP, port, "/", 200, 2.0)
            assert not closed.ok
            assert "without a response" in closed.message
        async with serving(silent_server) as port:
            silent = await probe_http(NODE_IP, port, "/", 200, 0.2)
            assert silent.message == f"http://{NODE_IP}:{port}/: no answer within 0.2s"

    asyncio.run(main())


def test_log_probe_finds_a_pattern_written_in_two_halves(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    probe = LogProbe(log, re.compile(r"server is ready"))
    assert probe.check() == ProbeResult(ok=False, message="log file not there yet")
    assert probe.offset == 0

    log.write_text("booting\nserver is re")
    first = probe.check()
    assert not first.ok
    assert probe.offset == log.stat().st_size

    with log.open("a") as f:
        f.write("ady on port 80\n")
    second = probe.check()
    assert second == ProbeResult(ok=True, message="log svc.log: matched 'server is ready'")
    assert probe.offset == log.stat().st_size


def test_log_probe_reads_at_most_max_read_per_check(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    filler = ("x" * 99 + "\n") * (LogProbe.MAX_READ // 100 + 1000)
    log.write_text(filler + "READY\n")
    probe = LogProbe(log, re.compile("READY"))
    assert not probe.check().ok
    assert probe.offset == LogProbe.MAX_READ
    assert probe.check().ok
    assert probe.offset == log.stat().st_size


def test_log_probe_resumes_from_an_offset_and_respects_line_starts(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("attempt 0 said: ready\n")
    # Restored in the middle of a line: `^ready` must not match the "ready" that follows.
    probe = LogProbe(log, re.compile(r"^ready", re.MULTILINE), offset=len("attempt 0 said: "))
    assert not probe.check().ok
    with log.open("a") as f:
        f.write("ready\n")
    assert probe.check().ok

    at_end = LogProbe.at_end(log, re.compile("ready"))
    assert at_end.offset == log.stat().st_size
    assert not at_end.check().ok


def test_log_probe_stays_ready_and_decodes_split_utf8(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    encoded = "prêt\n".encode()
    cut = encoded.index("ê".encode()) + 1  # in the middle of the two-byte character
    log.write_bytes(encoded[:cut])
    probe = LogProbe(log, re.compile("prêt"))
    assert not probe.check().ok
    with log.open("ab") as f:
        f.write(encoded[cut:])
    assert probe.check().ok
    with log.open("a") as f:
        f.write("crashed\n")
    assert probe.check().ok


@settings(max_examples=80, deadline=None)
@given(
    prefix=st.text(alphabet="ab \n", max_size=6000),
    cuts=st.lists(st.integers(min_value=0, max_value=7000), max_size=6),
)
def test_log_probe_offset_only_grows_and_any_split_is_found(prefix: str, cuts: list[int]) -> None:
    data = (prefix + "\nREADY-42\n").encode()
    match_end = data.index(b"READY-42") + len(b"READY-42")
    points = sorted({min(c, len(data)) for c in cuts} | {len(data)})
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "svc.log"
        log.touch()
        probe = LogProbe(log, re.compile(r"^READY-\d\d$", re.MULTILINE))
        offsets = [probe.offset]
        results = []
        written = 0
        for point in points:
            with log.open("ab") as f:
                f.write(data[written:point])
            written = point
            results.append(probe.check().ok)
            offsets.append(probe.offset)
        assert offsets == sorted(offsets)
        # Once ready the probe stops reading, so the offset rests somewhere past the match.
        assert match_end <= offsets[-1] <= len(data)
        # Ready exactly from the check that first sees the whole match, and then for good.
        assert results == [point >= match_end for point in points]


def test_file_probe(tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    assert probe_file(marker) == ProbeResult(ok=False, message=f"file {marker} not there yet")
    marker.touch()
    assert probe_file(marker) == ProbeResult(ok=False, message=f"file {marker} is empty")
    marker.write_text("ok\n")
    assert probe_file(marker) == ProbeResult(ok=True, message=f"file {marker} exists (3 bytes)")
    assert not probe_file(tmp_path).ok
