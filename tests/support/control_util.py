"""A job's control server on loopback, started and closed around a test's body."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from srtr.net.certs import JobCert
from srtr.runtime import control


@contextlib.asynccontextmanager
async def loopback_control(
    run_dir: Path, handler: Callable[[str, str | None, str | None], str], cert: JobCert
) -> AsyncIterator[control.ControlServer]:
    """The control server of `run_dir` on 127.0.0.1 with `cert`; intents go to `handler`,
    which refuses one by raising ValueError."""
    server = control.ControlServer(
        run_dir,
        handler,
        ValueError,
        context=cert.server_context(),
        fingerprint=cert.fingerprint,
        hosts=["127.0.0.1"],
        listen="127.0.0.1",
    )
    await server.start()
    try:
        yield server
    finally:
        await server.close()
