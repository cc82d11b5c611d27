"""Probes: each function makes one attempt and says whether the instance is ready (or alive).

The probe controller calls these. It owns periods, thresholds, timeouts' values and what a
failure means; here is only "is it ready right now, and if not, why", as a `ProbeResult` whose
message is shown to the user. Network probes are coroutines bounded by their timeout. The log
and file probes are synchronous on purpose: a stat or a read of at most 1 MiB of a local file
costs less than handing it to a thread.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import signal
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe attempt."""

    ok: bool
    message: str


class _BadResponse(Exception):
    """The peer answered, but not with an HTTP status line."""


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    # The peer may have reset the connection already; the socket is closed either way.
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _os_error(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = exc.strerror or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


# ASYNC109 wants callers to wrap us in asyncio.timeout instead, but running out of time is a
# probe result here, not an exception, so the timeout belongs to the probe.
async def probe_tcp(ip: str, port: int, timeout: float) -> ProbeResult:  # noqa: ASYNC109
    """Ready when a TCP connection to ip:port is accepted within `timeout` seconds."""
    where = f"tcp {_host_port(ip, port)}"

    async def connect() -> None:
        _, writer = await asyncio.open_connection(ip, port)
        await _close(writer)

    try:
        await asyncio.wait_for(connect(), timeout)
    # TimeoutError is an OSError: it must be caught first.
    except TimeoutError:
        return ProbeResult(ok=False, message=f"{where}: no answer within {timeout:g}s")
    except OSError as exc:
        return ProbeResult(ok=False, message=f"{where}: {_os_error(exc)}")
    return ProbeResult(ok=True, message=f"{where}: connected")


async def probe_http(
    ip: str,
    port: int,
    path: str,
    status: int,
    timeout: float,  # noqa: ASYNC109 (see probe_tcp)
) -> ProbeResult:
    """Ready when `GET path` (HTTP/1.0) answers with exactly `status` within `timeout` seconds.

    Only the status line is read; headers and body are ignored.
    """
    if not path.startswith("/"):
        path = "/" + path
    url = f"http://{_host_port(ip, port)}{path}"
    try:
        got = await asyncio.wait_for(_http_status(ip, port, path), timeout)
    except TimeoutError:
        return ProbeResult(ok=False, message=f"{url}: no answer within {timeout:g}s")
    except OSError as exc:
        return ProbeResult(ok=False, message=f"{url}: {_os_error(exc)}")
    except _BadResponse as exc:
        return ProbeResult(ok=False, message=f"{url}: {exc}")
    if got != status:
        return ProbeResult(ok=False, message=f"{url} -> {got} (want {status})")
    return ProbeResult(ok=True, message=f"{url} -> {got}")


async def _http_status(ip: str, port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        request = (
            f"GET {path} HTTP/1.0\r\nHost: {_host_port(ip, port)}\r\n"
            "User-Agent: srtr-probe\r\nConnection: close\r\n\r\n"
        )
        writer.write(request.encode("latin-1"))
        await writer.drain()
        try:
            line = await reader.readline()
        except ValueError as exc:
            raise _BadResponse("status line too long") from exc
    finally:
        await _close(writer)
    if not line:
        raise _BadResponse("connection closed without a response")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise _BadResponse(f"not an HTTP status line: {line[:80]!r}")
    return int(parts[1])


def probe_file(path: Path) -> ProbeResult:
    """Ready when `path` is a non-empty regular file (symlinks are followed)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return ProbeResult(ok=False, message=f"file {path} not there yet")
    except OSError as exc:
        return ProbeResult(ok=False, message=f"file {path}: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        return ProbeResult(ok=False, message=f"file {path} is not a regular file")
    if st.st_size == 0:
        return ProbeResult(ok=False, message=f"file {path} is empty")
    return ProbeResult(ok=True, message=f"file {path} exists ({st.st_size} bytes)")


class LogProbe:
    """Ready once `pattern` matches the text appended to a log since `offset`.

    Each `check` reads only the bytes added since the previous one, at most `MAX_READ` of them
    (the rest comes next time), and searches them together with the last `WINDOW` characters
    already seen, so a match split across two checks is still found; a match longer than
    `WINDOW` characters may be missed. Matching is latched: once ready, it stays ready.

    The backend appends every attempt to the same log, so a probe for a restarted attempt must
    start where that attempt's output begins: see `at_end`. `offset` only grows; persist it to
    resume after a controller restart.

    `^` and `$` follow the pattern's own flags, and `$` can match at the end of a line that is
    still being written.
    """

    MAX_READ = 1 << 20
    WINDOW = 4096

    def __init__(self, path: Path, pattern: re.Pattern[str], offset: int = 0) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self.path = path
        self.pattern = pattern
        self._offset = offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Text already searched, kept to catch matches that straddle two reads.
        self._window = ""
        # 1 when the window's first character is only context for `^`/lookbehinds: it was
        # searched before (or lies before `offset`) and must not start a match.
        self._search_from = 0
        self._need_context = offset > 0
        self._matched: str | None = None

    @classmethod
    def at_end(cls, path: Path, pattern: re.Pattern[str]) -> LogProbe:
        """A probe that ignores what the log holds now (0 if it does not exist yet)."""
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        return cls(path, pattern, offset=size)

    @property
    def offset(self) -> int:
        """Bytes of the log consumed so far."""
        return self._offset

    def check(self) -> ProbeResult:
        """One attempt: read what was appended since the last check and search it."""
        if self._matched is not None:
            return self._ok()
        try:
            with self.path.open("rb") as f:
                context = b""
                if self._need_context:
                    # The byte before `offset` tells whether the first new character starts a
                    # line, so `^` does not match in the middle of one.
                    f.seek(self._offset - 1)
                    context = f.read(1)
                else:
                    f.seek(self._offset)
                data = f.read(self.MAX_READ)
        except FileNotFoundError:
            return ProbeResult(ok=False, message="log file not there yet")
        except OSError as exc:
            return ProbeResult(ok=False, message=f"log {self.path}: {exc.strerror}")
        if context:
            self._need_context = False
            self._window = context.decode("utf-8", errors="replace")
            self._search_from = 1
        self._offset += len(data)
        text = self._decoder.decode(data)
        buf = self._window + text
        match = self.pattern.search(buf, self._search_from)
        if match is not None:
            self._matched = match.group(0)
            self._window = ""
            return self._ok()
        if len(buf) > self.WINDOW + 1:
            self._window = buf[-(self.WINDOW + 1) :]
            self._search_from = 1
        else:
            self._window = buf
        return ProbeResult(
            ok=False,
            message=f"log {self.path.name}: nothing matches {self.pattern.pattern!r} yet",
        )

    def _ok(self) -> ProbeResult:
        shown = self._matched if self._matched is not None else ""
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return ProbeResult(ok=True, message=f"log {self.path.name}: matched {shown!r}")


def probe_heartbeat(path: Path, max_age: float, now: float) -> ProbeResult:
    """Alive when `path`'s mtime is younger than `max_age` seconds at wall time `now`."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return ProbeResult(ok=False, message=f"heartbeat file {path} not there")
    except OSError as exc:
        return ProbeResult(ok=False, message=f"heartbeat file {path}: {exc.strerror}")
    age = now - mtime
    if age > max_age:
        return ProbeResult(
            ok=False, message=f"heartbeat file {path} last touched {age:.1f}s ago (> {max_age:g}s)"
        )
    return ProbeResult(ok=True, message=f"heartbeat file {path} touched {age:.1f}s ago")


def probe_silence(path: Path, silence: float, *, since: float, now: float) -> ProbeResult:
    """Alive when the log at `path` was written within `silence` seconds of wall time `now`.

    `since` is when watching began (this attempt's first look): output from before it, a
    previous attempt's, does not count as silence of this one.
    """
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        mtime = since
    except OSError as exc:
        return ProbeResult(ok=False, message=f"log {path.name}: {exc.strerror}")
    quiet = now - max(mtime, since)
    if quiet > silence:
        return ProbeResult(
            ok=False, message=f"log {path.name} silent for {quiet:.1f}s (> {silence:g}s)"
        )
    return ProbeResult(ok=True, message=f"log {path.name} written {quiet:.1f}s ago")


async def probe_exec(
    command: Sequence[str],
    env: Mapping[str, str],
    timeout: float,  # noqa: ASYNC109 (see probe_tcp)
    cwd: Path | None = None,
) -> ProbeResult:
    """Alive when `command` exits 0 within `timeout` seconds; its output's last line says
    why it did not. One that overstays is killed (its process group)."""
    what = "exec " + " ".join(command)
    if len(what) > 60:
        what = what[:57] + "..."
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=cwd,
            start_new_session=True,  # its children are killed with it on a timeout
        )
    except OSError as exc:
        return ProbeResult(ok=False, message=f"{what}: cannot run: {_os_error(exc)}")
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return ProbeResult(ok=False, message=f"{what}: no answer within {timeout:g}s")
    if proc.returncode == 0:
        return ProbeResult(ok=True, message=f"{what}: exit 0")
    lines = out.decode("utf-8", errors="replace").strip().splitlines()
    last = f": {lines[-1][:120]}" if lines else ""
    return ProbeResult(ok=False, message=f"{what}: exit {proc.returncode}{last}")
