"""Programs the health scenarios run as instances (`python3 health_programs.py MODE ...`).

Unlike the tests' workloads, every attempt misbehaves again, so one job yields many samples:

- `wedged HOST PORT`: accepts connections and never answers (a deadlocked server);
- `silent MARKS`: prints a few lines, appends "PID EPOCH" (its own clock) to MARKS, then
  stops itself (SIGSTOP): alive to the kernel, silent to its log;
- `hog MARKS`: allocates (and touches) 4 MiB at a time, appending "PID EPOCH" to MARKS after
  each block, until the kernel kills it; exits 3 after 512 MiB (no limit took effect; kept
  small, as the machine is shared).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

BLOCK = 4 << 20


def mark(path: str) -> None:
    with open(path, "a", encoding="ascii") as handle:
        handle.write(f"{os.getpid()} {time.time():.6f}\n")


def wedged(host: str, port: int) -> None:
    server = socket.create_server((host, port))
    print(f"serving on {host}:{port}, never answering", flush=True)
    held = []
    while True:
        conn, _ = server.accept()
        held.append(conn)


def silent(marks: str) -> None:
    for n in range(3):
        print(f"tick {n}", flush=True)
        time.sleep(0.05)
    mark(marks)
    os.kill(os.getpid(), signal.SIGSTOP)
    while True:  # after a SIGCONT: still silent
        time.sleep(3600)


def hog(marks: str) -> None:
    kept = []
    for _ in range((512 << 20) // BLOCK):
        kept.append(b"x" * BLOCK)
        mark(marks)
    print("allocated 512 MiB and was not killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "wedged":
        wedged(sys.argv[2], int(sys.argv[3]))
    elif mode == "silent":
        silent(sys.argv[2])
    elif mode == "hog":
        hog(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode}")
