"""Small programs the health end-to-end tests run as instances (`python3 health_workloads.py
MODE ...`): a server that wedges, a process that stops itself, static-rendezvous ranks.

Each reads SRTR_RESTART_COUNT to behave differently on its first attempt.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

RESTARTS = int(os.environ.get("SRTR_RESTART_COUNT", "0"))


def wedged_server(host: str, port: int) -> None:
    """Accepts connections; answers HTTP 200 only after a restart (the first attempt
    accepts and never answers, as a deadlocked server does)."""
    server = socket.create_server((host, port), reuse_port=False)
    print(f"serving on {host}:{port}, restart {RESTARTS}", flush=True)
    held = []
    while True:
        conn, _ = server.accept()
        if RESTARTS == 0:
            held.append(conn)  # wedged: the kernel accepted it, nobody will answer
            continue
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")


def chatty() -> None:
    """Prints a line every 0.1 s; on its first attempt it stops itself (SIGSTOP) after a few
    lines: alive to the kernel, silent to its log."""
    for n in range(1_000_000):
        print(f"tick {n} (restart {RESTARTS})", flush=True)
        if RESTARTS == 0 and n == 5:
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.1)


def rank(index: int, size: int, crash: str) -> None:
    """A static rendezvous: every rank checks in under its restart count and waits for all
    `size`; rank 1 then crashes (`once`: on the first attempt only; `always`). The others
    would wait forever for a relaunched rank 1 alone: only a pool restart brings them on.
    `hold`: every rank runs on after its first rendezvous, until a pool restart."""
    run_dir = Path(os.environ["SRTR_RUN_DIR"])
    rdv = run_dir / "rdv" / str(RESTARTS)
    rdv.mkdir(parents=True, exist_ok=True)
    if index == 1 and (crash == "always" or (crash == "once" and RESTARTS == 0)):
        print(f"rank {index} crashes before the rendezvous", flush=True)
        sys.exit(1)
    (rdv / f"rank{index}").write_text("in")
    print(f"rank {index} checked in (restart {RESTARTS})", flush=True)
    while len(list(rdv.iterdir())) < size:
        time.sleep(0.05)
    if crash == "hold" and RESTARTS == 0:
        time.sleep(1000)  # a long first run, which a lost node cuts short
    seen = run_dir / "seen"
    seen.mkdir(exist_ok=True)
    (seen / f"rank{index}").write_text(str(RESTARTS))
    print(f"rank {index} done", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "wedged":
        wedged_server(sys.argv[2], int(sys.argv[3]))
    elif mode == "chatty":
        chatty()
    else:
        rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
