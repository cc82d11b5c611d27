"""A `srtr up` whose TUI was detached (`d`): the job goes on headless, in the background.

The job's controller is this process: the instances are its children, so it cannot hand
the job to another process. Detaching makes this process headless instead:

- stdin reads /dev/null; stdout and stderr append to the run dir's logs/srtr.log, which
  has every event already (the TUI had the terminal, so there were no progress lines);
  nothing writes to the terminal again, and nothing can block on it.
- SIGHUP no longer tears the job down: it is ignored (and Textual's SIGCONT and SIGTSTP
  handlers, which would bring the TUI back, are reset). A closed terminal window or a
  dropped ssh connection hangs up the terminal, and the kernel (and the shell) then send
  SIGHUP to the jobs of that terminal; the detached job survives it. SIGINT and SIGTERM
  still tear it down, and so does `srtr down RUN_DIR`.
- The shell gets its prompt back: the process stops itself (as Ctrl+Z would) and a helper
  process continues it at once, so the shell sees its job stopped, prints its prompt, and
  then the job goes on in the background (`jobs` says Running; `fg` is harmless: the job
  reads nothing). Without a job-control shell the stop is a few milliseconds long.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

# The helper: continue the pid once it is stopped, and leave once it runs again (at most
# ~10 s). The kernel shows a stopping multi-threaded process as D for a while, not T: both
# mean "continue it" here, since it stops itself before this helper has even started, and
# a SIGCONT to a process that runs is harmless.
_CONTINUER = """
import os, signal, sys, time
pid = int(sys.argv[1])
def state():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
sent = False
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    now = state()
    if now is None:
        break
    if now in ("T", "t", "D"):
        os.kill(pid, signal.SIGCONT)
        sent = True
    elif sent:
        break
    time.sleep(0.005)
"""


def go_headless(log_path: Path) -> None:
    """Point stdio away from the terminal (stdout, stderr: append to `log_path`) and stop
    SIGHUP from ending the job. Call it on the job's event loop."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    finally:
        os.close(null)
        os.close(log)
    loop = asyncio.get_running_loop()
    loop.remove_signal_handler(signal.SIGHUP)  # StopSignals' teardown on SIGHUP
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Textual's driver leaves its Ctrl+Z handlers behind: its SIGCONT handler would start
    # the TUI again (on the log file) when this process is continued.
    for signum in (signal.SIGCONT, signal.SIGTSTP):
        signal.signal(signum, signal.SIG_DFL)


def to_background() -> None:
    """Give the shell its prompt back: stop this process and have a helper continue it."""
    if not sys.platform.startswith("linux"):
        return  # the helper reads /proc
    try:
        helper = subprocess.Popen(
            [sys.executable, "-c", _CONTINUER, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in our process group: the shell stops only us
        )
    except OSError:
        return  # no helper: stopping would be for ever; stay in the foreground instead
    threading.Thread(target=helper.wait, name="srtr-continuer", daemon=True).start()  # reap it
    os.kill(os.getpid(), signal.SIGSTOP)
