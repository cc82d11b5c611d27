"""The exit watcher on real processes: exits reach the loop, and no pidfd is in our fd table."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from srtr.backends import exit_watch
from srtr.backends.exit_watch import ExitWatcher, exit_watcher
from tests.support.e2e_util import wait_for


def pidfds_here() -> list[int]:
    """The pidfds in this thread group's (the main thread's) fd table."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[pidfd]":
                found.append(int(name))
        except OSError:
            continue  # listdir's own fd
    return found


def test_exits_reach_the_loop_and_no_pidfd_stays_in_the_launchers_fd_table() -> None:
    watcher = exit_watcher()
    assert watcher.private  # unshare(CLONE_FILES) works here: CI must cover that path
    before = pidfds_here()
    sleepers = [subprocess.Popen(["sleep", "1000"]) for _ in range(20)]

    def fds_of_a_new_process() -> int:
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(len(os.listdir('/proc/self/fd')))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(child.stdout)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        exited: asyncio.Queue[int] = asyncio.Queue()
        for proc in sleepers:
            watcher.watch(proc.pid, loop, lambda pid=proc.pid: exited.put_nowait(pid))
        # 20 live watched processes and not one pidfd of ours: a process started now gets
        # no copy of them to close at exec.
        assert pidfds_here() == before
        assert fds_of_a_new_process() < 10
        for proc in sleepers[:5]:
            proc.kill()
        seen = {await asyncio.wait_for(exited.get(), 10) for _ in range(5)}
        assert seen == {p.pid for p in sleepers[:5]}
        for proc in sleepers[:5]:
            proc.wait()  # the watcher never reaps: the zombie was ours to wait for
        for proc in sleepers[5:]:
            proc.kill()
            proc.wait()
        rest = {await asyncio.wait_for(exited.get(), 10) for _ in range(15)}
        assert rest == {p.pid for p in sleepers[5:]}

    asyncio.run(body())


def test_an_unwatched_exit_is_not_reported_and_a_watched_one_after_it_is() -> None:
    watcher = exit_watcher()
    first = subprocess.Popen(["sleep", "1000"])
    second = subprocess.Popen(["sleep", "1000"])

    async def body() -> None:
        loop = asyncio.get_running_loop()
        calls: list[str] = []
        done = asyncio.Event()
        key = watcher.watch(first.pid, loop, lambda: calls.append("first"))
        watcher.watch(second.pid, loop, lambda: (calls.append("second"), done.set()))
        watcher.unwatch(key)
        first.kill()
        first.wait()
        second.kill()  # after the first: its report comes after the first's would have
        await asyncio.wait_for(done.wait(), 10)
        second.wait()
        assert calls == ["second"]

    asyncio.run(body())


def test_a_process_that_is_gone_cannot_be_watched() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names nothing now

    async def body() -> None:
        try:
            exit_watcher().watch(proc.pid, asyncio.get_running_loop(), lambda: None)
        except ProcessLookupError:
            return
        raise AssertionError("watching a reaped pid succeeded")

    asyncio.run(body())


def test_a_closed_loops_report_socket_leaves_the_watchers_table() -> None:
    """A process that runs one loop after another (a test run, `asyncio.run` twice) must
    not fill the watcher thread's fd table with the report sockets of closed loops: full,
    it could take no more pidfds and every later exit would go unseen."""
    watcher = ExitWatcher()
    assert watcher.private
    table = f"/proc/self/task/{watcher._thread.native_id}/fd"

    def sockets() -> int:
        """Sockets in the thread's table: the one the pidfds arrive on, and report ends."""
        found = 0
        for name in os.listdir(table):
            with contextlib.suppress(OSError):
                found += os.readlink(f"{table}/{name}").startswith("socket:")
        return found

    async def one_exit() -> None:
        proc = subprocess.Popen(["true"])  # noqa: ASYNC220 (a child that ends at once)
        done = asyncio.Event()
        watcher.watch(proc.pid, asyncio.get_running_loop(), done.set)
        await asyncio.wait_for(done.wait(), 10)
        proc.wait()

    asyncio.run(one_exit())
    gc.collect()
    wait_for(lambda: sockets() == 1, 10, "the first loop's report socket let go")
    for _ in range(40):
        asyncio.run(one_exit())
    gc.collect()
    wait_for(lambda: sockets() == 1, 10, "the closed loops' report sockets let go")


def test_the_watcher_thread_takes_no_signal() -> None:
    """The kernel hands a process-directed signal (Ctrl+C, SIGTERM) to any thread that does
    not block it. Were that the watcher, whose fd table lacks the loop's wakeup socket,
    Python's handler would write the byte that tells the loop nowhere: the signal lost."""
    watcher = exit_watcher()
    assert watcher.private
    native_id = watcher._thread.native_id
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.M)[1], 16)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        assert blocked & (1 << (signum - 1)), signum.name


class _Finalized:
    """Garbage in a reference cycle that notes the thread that finalized it."""

    def __init__(self, where: list[str]) -> None:
        self.where = where
        self.cycle = self

    def __del__(self) -> None:
        self.where.append(threading.current_thread().name)


def test_a_collection_on_the_watcher_thread_finalizes_nothing_there() -> None:
    """A collection runs every finalizer on the thread whose allocation started it. On the
    watcher thread, a socket leaked in a cycle would close its fd number in the thread's own
    table: a pidfd (its exit never reported) or the socket the pidfds arrive on."""
    assert exit_watcher()._thread.ident in exit_watch._guarded
    where: list[str] = []

    def collect_as_a_watcher() -> None:
        exit_watch._guarded.add(threading.get_ident())
        try:
            _Finalized(where)
            gc.collect()
        finally:
            exit_watch._guarded.discard(threading.get_ident())

    helper = threading.Thread(target=collect_as_a_watcher, name="as-a-watcher")
    helper.start()
    helper.join()
    assert where == []  # held, not freed there
    gc.collect()
    assert where == ["MainThread"]
    assert gc.get_freeze_count() == 0  # unfrozen when that collection ended


def test_the_watcher_thread_closes_its_own_fds_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed watcher thread's sockets and epoll, kept alive by its traceback (a log
    record, an excepthook) and freed on another thread, must not close those numbers in the
    process's table: one was this test worker's pipe to pytest-xdist's controller."""
    watcher = ExitWatcher()
    assert watcher.private
    table = f"/proc/self/task/{watcher._thread.native_id}/fd"
    theirs = {int(name) for name in os.listdir(table)}
    ours: dict[int, int] = {}  # an fd of ours at each of the thread's numbers → its inode
    spare: list[int] = []
    while not theirs <= set(ours):
        fd = os.open(os.devnull, os.O_RDONLY)
        spare.append(fd)
        ours = {n: os.fstat(n).st_ino for n in theirs if _is_open(n)}
    failures: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    quiet = logging.Logger("exit-watch-test")  # pytest's log capture would hold the traceback
    quiet.addHandler(logging.NullHandler())
    monkeypatch.setattr(exit_watch, "log", quiet)

    def fail(self: object) -> bool:
        raise RuntimeError("a bug in the watcher")

    monkeypatch.setattr(exit_watch._Thread, "_receive", fail)
    proc = subprocess.Popen(["sleep", "1000"])
    try:

        async def body() -> None:
            with contextlib.suppress(OSError):
                watcher.watch(proc.pid, asyncio.get_running_loop(), lambda: None)

        asyncio.run(body())
        watcher._thread.join(10)
        assert not watcher._thread.is_alive()
        assert [type(f.exc_value) for f in failures] == [RuntimeError]
        failures.clear()  # the traceback, and the thread's objects, freed here
        gc.collect()
        assert {n: os.fstat(n).st_ino for n in theirs} == ours
    finally:
        proc.kill()
        proc.wait()
        for fd in spare:
            with contextlib.suppress(OSError):  # closed by the bug this test catches
                os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
