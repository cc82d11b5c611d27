"""supervisord (PyPI `supervisor`), the baseline process manager of the local scenarios."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


class Supervisor:
    """supervisord (PyPI `supervisor`) managing `programs` {name: command line} in `where`.

    Configured as a careful user would (issue 15, "honest numbers"), and `settings` says so:
    - every program in one `[group:GROUP]`: on shutdown supervisord stops one group per
      main-loop pass, so 4,096 groups of one (the default) take 4,096 passes to stop;
    - `startsecs=0`, so RUNNING means started, as srtr's `Launched` does;
    - `loglevel=info`, so its own log says when each program entered RUNNING: the harness
      reads that file (`running_times`) instead of polling `getAllProcessInfo`, which would
      load the very loop being measured.
    """

    GROUP = "all"

    def __init__(self, where: Path, programs: dict[str, str], *, autorestart: bool = True) -> None:
        self.where = where
        self.sock = where / "supervisor.sock"
        self.log = where / "supervisord.log"
        (where / "logs").mkdir(parents=True, exist_ok=True)
        lines = [
            "[supervisord]",
            "nodaemon=true",
            f"logfile={self.log}",
            f"pidfile={where / 'supervisord.pid'}",
            f"childlogdir={where / 'logs'}",
            "loglevel=info",
            f"minfds={min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 4 * len(programs) + 64)}",
            "[unix_http_server]",
            f"file={self.sock}",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            f"[group:{self.GROUP}]",
            f"programs={','.join(programs)}",
        ]
        self.settings = (
            f"autorestart={'true' if autorestart else 'false'} startsecs=0 "
            f"startretries=1000000; all {len(programs)} program(s) in one [group:{self.GROUP}]; "
            "RUNNING read from its log (loglevel=info), no XML-RPC polling while measuring"
        )
        for name, command in programs.items():
            lines += [
                f"[program:{name}]",
                f"command={command}",
                f"autorestart={'true' if autorestart else 'false'}",
                "startsecs=0",
                "startretries=1000000",
                "stopwaitsecs=30",
                "redirect_stderr=true",
                f"stdout_logfile={where / 'logs' / (name + '.out')}",
                "stdout_logfile_backups=0",
            ]
        self.conf = where / "supervisord.conf"
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        binary = shutil.which("supervisord")
        if binary is None:
            raise RuntimeError("supervisord not found: pip install 'srtr[bench]'")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [binary, "-n", "-c", str(self.conf)],
            stdout=open(where / "supervisord.stdout", "wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid

    def rpc(self) -> Any:
        from xmlrpc.client import ServerProxy

        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.sock}")
        return ServerProxy("http://127.0.0.1", transport=transport)

    def wait_rpc(self, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                server = self.rpc()
                server.supervisor.getState()
                return server
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError("supervisord exited early") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def running_times(self) -> list[float]:
        """Epoch times of its log's 'entered RUNNING state' lines (its own clock, 1 ms)."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            if "entered RUNNING state" in line:
                stamp, _, millis = line[:23].partition(",")
                when = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
                out.append(when + int(millis) / 1000)
        return out

    def wait_all_running(self, count: int, timeout: float) -> float:
        """When the `count`th program entered RUNNING, from its log; the log is read every
        0.2 s (one file read, nothing asked of supervisord)."""
        deadline = time.monotonic() + timeout
        while True:
            times = self.running_times()
            if len(times) >= count:
                return sorted(times)[count - 1]
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisord exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(times)}/{count} programs RUNNING after {timeout}s")
            time.sleep(0.2)

    def infos(self) -> list[dict[str, Any]]:
        return list(self.wait_rpc().supervisor.getAllProcessInfo())

    def shutdown(self, timeout: float = 120) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                for info in self.rpc().supervisor.getAllProcessInfo():
                    if info["pid"]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(info["pid"], signal.SIGKILL)
        self.shutdown()
