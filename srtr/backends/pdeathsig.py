"""Child processes that die with srtr: `setpriv --pdeathsig` (util-linux) in front of argv.

A SIGKILLed srtr cannot clean up after its children; the kernel can still signal them when
it dies (prctl PR_SET_PDEATHSIG, which setpriv sets before it execs the command).
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import threading

log = logging.getLogger("srtr")


def dies_with_us(argv: list[str]) -> list[str]:
    """`argv` under `setpriv --pdeathsig SIGTERM`: the command gets SIGTERM when srtr dies,
    even by SIGKILL. For salloc that matters: one that gets SIGTERM while its job is pending
    cancels the job (measured: docs/slurm-facts.md (h)); without it a pending salloc outlives
    a killed srtr, is granted later and leaves an allocation nobody releases.

    The kernel sends the death signal when the THREAD that forked the child exits, not the
    process: salloc is started from the main thread (`srtr up`, before the event loop), whose
    end is srtr's end. From any other thread the plain command is used (a worker thread that
    ends would cancel a wanted allocation). Without a setpriv that knows --pdeathsig
    (util-linux >= 2.33) the plain command is used too, and a log line says so.
    """
    if threading.current_thread() is not threading.main_thread():
        return argv
    setpriv = _setpriv()
    if setpriv is None:
        log.warning(
            "setpriv --pdeathsig (util-linux) is not available: if srtr is killed, "
            "%s keeps running (a pending salloc: the guard cancels its job)",
            argv[0],
        )
        return argv
    return [setpriv, "--pdeathsig", "SIGTERM", "--", *argv]


@functools.cache
def _setpriv() -> str | None:
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if "--pdeathsig" in done.stdout else None
