"""The control channel of a running job: a Unix socket only its owner can use (0600).

`srtr up` serves it; `srtr tui RUN_DIR`, `srtr down` and tests send intents through it. One
JSON object per line each way: `{"op": "restart", "instance": "service_x_node2"}` →
`{"ok": true, "message": "restarting service_x_node2"}`. Ops are those of
`controllers.intents`. The socket lives in the run dir when its path fits a Unix socket
address (108 bytes), else under the temp dir; state.json records where (`job.control`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srtr.reconciler.rundir import StateFileError, read_state

SOCKET_NAME = "control.sock"
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin
_MAX_REQUEST = 64 * 1024


class ControlError(Exception):
    """The job could not be reached, or refused the intent; the message says which."""


def socket_path(run_dir: Path) -> Path:
    path = run_dir.resolve() / SOCKET_NAME
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"srtr-{os.getuid()}-{digest}.sock"


Handler = Callable[[str, str | None, str | None], str]


class ControlServer:
    """Serves intents to `handler(op, instance, node) -> message`; handler raises to refuse."""

    def __init__(self, run_dir: Path, handler: Handler, refusal: type[Exception]) -> None:
        self.path = socket_path(run_dir)
        self._handler = handler
        self._refusal = refusal
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def reopen(self) -> None:
        """Listen again at the same path, if its file is gone (the run dir was removed)."""
        if self.path.exists():
            return
        if self._server is not None:
            self._server.close()
        await self.start()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            reply = self._answer(line[:_MAX_REQUEST])
            writer.write((json.dumps(reply) + "\n").encode())
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "message": "requests are one JSON object per line"}
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return {"ok": False, "message": 'a request needs an "op"'}
        instance, node = request.get("instance"), request.get("node")
        for key, value in (("instance", instance), ("node", node)):
            if value is not None and not isinstance(value, str):
                return {"ok": False, "message": f'"{key}" must be a string'}
        try:
            return {"ok": True, "message": self._handler(request["op"], instance, node)}
        except self._refusal as exc:
            return {"ok": False, "message": str(exc)}


def send(
    run_dir: Path,
    op: str,
    instance: str | None = None,
    timeout: float = 5.0,
    *,
    node: str | None = None,
) -> str:
    """Send one intent to the job of `run_dir`; return its message.

    Raises:
        ControlError: the job is not running, or it refused the intent.
    """
    path = _recorded_path(run_dir) or socket_path(run_dir)
    request = {
        "op": op,
        **({"instance": instance} if instance else {}),
        **({"node": node} if node else {}),
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall((json.dumps(request) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlError(f"the job of {run_dir} is not running (no control socket)") from None
    except OSError as exc:
        raise ControlError(f"cannot reach the job of {run_dir}: {exc}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError("the job sent no answer") from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("message", "refused")))
    return str(reply.get("message", ""))


def _recorded_path(run_dir: Path) -> Path | None:
    try:
        recorded = read_state(run_dir).job.get("control")
    except StateFileError:
        return None
    return Path(recorded) if isinstance(recorded, str) else None
