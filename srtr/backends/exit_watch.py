"""Watch processes exit from a thread whose fd table holds their pidfds, not ours.

Why a thread with a file table of its own (unshare(CLONE_FILES)): a pidfd per live
instance is 4,096 fds in a 4,096-instance job, and every process the controller starts
gets a copy of its fd table, which exec then closes one close-on-exec fd at a time (perf of
that launch: dnotify_flush, filp_flush, locks_remove_posix, dup_fd ≈ 17 % of the machine's
samples, growing with every instance already running). Here the pidfds live in this
thread's table only, so the table a launch copies stays small whatever the job's size
(4,096 local instances all Running: 8.4-9.1 s → 6.5 s on 2 cores).

`watch(pid, loop, callback)` opens the pidfd on the caller's thread (so a failure, EMFILE
say, is the caller's error at once), passes it to the thread over a Unix socket
(SCM_RIGHTS) and closes its own copy. The thread waits on every pidfd with one epoll; when
one becomes readable (the process is a zombie, or gone if not our child) it closes it and
writes the key to that loop's report socket, which the loop reads (`add_reader`) and runs
`callback` on. Reaping stays the caller's: the thread never waits on a pid.

The thread may touch no fd of the process's table but its own: an fd number means another
file there (so `call_soon_threadsafe`, which writes the loop's self-pipe, is out). Each
loop's report socket is handed to it like a pidfd, once per loop. For the same reason it
blocks every signal: the kernel may hand a process-directed signal (Ctrl+C, SIGTERM) to any
thread that does not block it, and Python's handler would then write the signal's wakeup
byte to an fd number this table does not hold, so the loop would never learn of it.

An fd number also means another file when Python closes it on the wrong side, and Python
closes fds in whichever thread frees their objects. Two ways that happens, both kept out:
- The cyclic garbage collector runs on the thread whose allocation triggers it, with every
  finalizer of what it frees. On this thread, a socket the process leaked in a reference
  cycle would close its number here: a pidfd (that exit never seen), the socket the pidfds
  arrive on, or the epoll. So a collection that starts on this thread first freezes every
  tracked object (`gc.freeze`) and finds nothing to free; they are unfrozen into the oldest
  generation when it ends, and a later collection on another thread frees what is garbage.
  (srtr freezes nothing itself; this unfreezes what another library froze.)
- The thread's own sockets and epoll, kept alive past its end by a traceback that a log
  record or an excepthook holds, would close their numbers in the process's table when
  freed there. The thread closes them itself before it ends, whatever ends it.

Where unshare is refused (a seccomp filter), the thread works the same in the shared
table: slower launches, same behaviour.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import gc
import itertools
import logging
import os
import select
import signal
import socket
import struct
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger("srtr")

_CLONE_FS, _CLONE_FILES = 0x00000200, 0x00000400
_WATCH, _UNWATCH, _CHANNEL = 1, 2, 3
_MESSAGE = struct.Struct("=BQQ")  # op, key (or channel), channel
_KEY = struct.Struct("=Q")
# Python 3.11's socket.recv_fds drops its flags argument: recvmsg itself, then. Close-on-exec
# matters only where unshare was refused (a shared table).
_NOWAIT = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
_FD_SPACE = socket.CMSG_SPACE(4)
_REPORT = 4096  # keys per report datagram

Callback = Callable[[], None]


class _Channel:
    """A loop's end of its report socket."""

    def __init__(self, number: int, loop: asyncio.AbstractEventLoop, watcher: ExitWatcher):
        self.number = number
        self.sock, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), watcher._reported, self.sock)
        # A closed (collected) loop's socket is closed with it: the thread's next report
        # to it fails and it forgets the channel.
        weakref.finalize(loop, self.sock.close)


class ExitWatcher:
    """One thread watching every pid handed to it; see the module doc."""

    def __init__(self) -> None:
        self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rx = theirs.detach()  # the thread's end, as an fd number in each table
        self._keys = itertools.count(1)
        # key → callback; popped by whichever comes first: the exit's report or unwatch.
        self._pending: dict[int, Callback] = {}
        self._channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Channel] = (
            weakref.WeakKeyDictionary()
        )
        self._numbers = itertools.count(1)
        self.private = False  # the thread got a table of its own (tests check it)
        self._started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(rx,), name="srtr-exit-watch", daemon=True
        )
        self._thread.start()
        self._started.wait()
        if self.private:
            os.close(rx)  # the thread holds its own copy

    def watch(self, pid: int, loop: asyncio.AbstractEventLoop, callback: Callback) -> int:
        """Call `callback` on `loop` once `pid` has exited; a key for `unwatch`. Call it on
        `loop`'s thread.

        Raises:
            OSError: the pidfd cannot be opened (no such process, too many open files).
        """
        channel = self._channels.get(loop)
        if channel is None:
            channel = self._channels[loop] = _Channel(next(self._numbers), loop, self)
            try:
                self._send(_CHANNEL, channel.number, 0, channel.theirs.fileno())
            finally:
                channel.theirs.close()
        pidfd = os.pidfd_open(pid)
        key = next(self._keys)
        self._pending[key] = callback
        try:
            self._send(_WATCH, key, channel.number, pidfd)
        except OSError:
            del self._pending[key]
            raise
        finally:
            os.close(pidfd)
        return key

    def unwatch(self, key: int) -> None:
        """Stop watching; the callback is not called after this."""
        if self._pending.pop(key, None) is not None:
            with contextlib.suppress(OSError):
                self._ours.send(_MESSAGE.pack(_UNWATCH, key, 0))

    def _send(self, op: int, key: int, channel: int, fd: int) -> None:
        socket.send_fds(self._ours, [_MESSAGE.pack(op, key, channel)], [fd])

    def _reported(self, sock: socket.socket) -> None:
        """The loop's reader: run the callbacks of the exits the thread reported."""
        while True:
            try:
                data = sock.recv(_REPORT * _KEY.size)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            for (key,) in _KEY.iter_unpack(data):
                callback = self._pending.pop(key, None)
                if callback is None:
                    continue  # unwatched meanwhile
                try:
                    callback()
                except Exception:  # one handler's bug must not cost the others their exits
                    log.exception("exit callback failed")

    # -- the thread -------------------------------------------------------------------------

    def _run(self, rx: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        _guarded.add(threading.get_ident())  # before unshare: no collection frees here after
        try:
            self._serve(rx)
        except Exception:  # a bug here would silently stop every exit report: say so
            log.exception("the exit watcher failed: exits are no longer seen")
            raise
        finally:
            _guarded.discard(threading.get_ident())

    def _serve(self, rx: int) -> None:
        self.private = _own_tables(rx)
        self._started.set()
        thread = _Thread(rx)
        try:
            thread.serve()
        finally:
            thread.close()  # here, in this table: see the module doc


# The idents of the watcher threads, on which a collection must free nothing (module doc).
_guarded: set[int] = set()


def _hold_collection(phase: str, info: dict[str, int]) -> None:
    """A `gc.callbacks` hook: a collection that starts on a watcher thread finds every
    object frozen, so no finalizer runs there; they are unfrozen when it stops."""
    if threading.get_ident() not in _guarded:
        return
    if phase == "start":
        gc.freeze()
    else:
        gc.unfreeze()


gc.callbacks.append(_hold_collection)


def _own_tables(rx: int) -> bool:
    """Give the calling thread a cwd, root and fd table of its own; whether it got the fd
    table (then it holds only `rx` and what it opens later)."""
    unshare = ctypes.CDLL(None, use_errno=True).unshare
    # Its own cwd and root too: a thread sharing them with the launching thread would
    # make that thread's setns(2) into a node's view and back fail (EINVAL).
    unshare(ctypes.c_int(_CLONE_FS))
    if unshare(ctypes.c_int(_CLONE_FILES)) != 0:
        return False
    # A copy of every fd the process had: drop them, or a socket the controller
    # closes would stay open here (its peer would never see the end).
    os.closerange(3, rx)
    os.closerange(rx + 1, 0x7FFFFFFF)
    return True


class _Thread:
    """The watcher thread's side: its epoll over the pidfds, the loops' report sockets
    (for their end, and for room when one is full), and the socket the pidfds arrive on."""

    def __init__(self, rx: int) -> None:
        self.rx = rx
        self.sock = socket.socket(fileno=rx)
        self.epoll = select.epoll()
        self.epoll.register(rx, select.EPOLLIN)
        self.watched: dict[int, tuple[int, int]] = {}  # pidfd (in this table) → (key, channel)
        self.pidfds: dict[int, int] = {}  # key → pidfd
        self.channels: dict[int, _Reports] = {}  # channel number → its end here
        self.by_fd: dict[int, _Reports] = {}  # the same, by the fd of that end

    def serve(self) -> None:
        """Until the process exits: report each exit to its loop's socket."""
        while True:
            exited: set[_Reports] = set()
            for fd, events in self.epoll.poll():
                reports = self.by_fd.get(fd)
                if reports is not None:
                    self._channel_event(reports, events, exited)
                elif fd != self.rx:
                    self._exited(fd, exited)
                elif not self._receive():
                    return
            for reports in exited:
                if reports.number in self.channels:  # not closed in this same batch
                    self._flush(reports)

    def _channel_event(self, reports: _Reports, events: int, exited: set[_Reports]) -> None:
        if events & (select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP):
            # Its loop was closed: drop its end now, not at its next exit (which may never
            # come), or a process that runs one loop after another (a test run) fills this
            # table with ends nobody reads, until a pidfd no longer fits.
            self._drop(reports)
        else:  # a full socket has room again: send the rest
            self.epoll.modify(reports.sock.fileno(), select.EPOLLRDHUP)
            exited.add(reports)

    def _exited(self, pidfd: int, exited: set[_Reports]) -> None:
        self.epoll.unregister(pidfd)
        os.close(pidfd)
        key, channel = self.watched.pop(pidfd)
        del self.pidfds[key]
        reports = self.channels.get(channel)
        if reports is not None:
            reports.keys.append(key)
            exited.add(reports)

    def _receive(self) -> bool:
        """Take every message waiting on the socket; False once the process is exiting."""
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(_MESSAGE.size, _FD_SPACE, _NOWAIT)
            except BlockingIOError:
                return True
            if not data:  # the process is exiting: nothing more to watch
                return False
            op, key, channel = _MESSAGE.unpack(data)
            fds = array.array("i")
            for _level, _type, payload in ancillary:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if op in (_CHANNEL, _WATCH) and not fds:
                # The kernel dropped the descriptor (this table is at its limit): say so,
                # and go on watching the others.
                log.error("exit watcher: a descriptor did not arrive (open files limit?)")
            elif op == _CHANNEL:
                self._add_channel(key, socket.socket(fileno=fds[0]))
            elif op == _WATCH:
                self.watched[fds[0]] = (key, channel)
                self.pidfds[key] = fds[0]
                self.epoll.register(fds[0], select.EPOLLIN)
            elif key in self.pidfds:  # unwatched before its exit was seen
                pidfd = self.pidfds.pop(key)
                del self.watched[pidfd]
                self.epoll.unregister(pidfd)
                os.close(pidfd)

    def _add_channel(self, number: int, sock: socket.socket) -> None:
        reports = self.channels[number] = _Reports(number, sock)
        self.by_fd[sock.fileno()] = reports
        self.epoll.register(sock.fileno(), select.EPOLLRDHUP)

    def close(self) -> None:
        """Close every fd this thread holds: its pidfds, report ends, epoll and socket."""
        for pidfd in self.watched:
            with contextlib.suppress(OSError):
                os.close(pidfd)
        self.watched.clear()
        self.pidfds.clear()
        for reports in self.channels.values():
            reports.sock.close()
        self.channels.clear()
        self.by_fd.clear()
        self.epoll.close()
        self.sock.close()

    def _drop(self, reports: _Reports) -> None:
        fd = reports.sock.fileno()
        self.epoll.unregister(fd)
        del self.by_fd[fd]
        del self.channels[reports.number]
        reports.sock.close()

    def _flush(self, reports: _Reports) -> None:
        match reports.flush():
            case "full":  # the loop is busy: send the rest once it has read
                self.epoll.modify(reports.sock.fileno(), select.EPOLLRDHUP | select.EPOLLOUT)
            case "gone":  # its loop was closed: nobody is left to tell
                self._drop(reports)


class _Reports:
    """The thread's end of one loop's report socket, with the keys not sent yet."""

    def __init__(self, number: int, sock: socket.socket) -> None:
        self.number = number
        self.sock = sock
        sock.setblocking(False)
        self.keys: list[int] = []

    def flush(self) -> str:
        """Send what is pending: "sent", "full" (some left) or "gone"."""
        while self.keys:
            chunk = self.keys[:_REPORT]
            try:
                self.sock.send(struct.pack(f"={len(chunk)}Q", *chunk))
            except BlockingIOError:
                return "full"
            except OSError:
                return "gone"
            del self.keys[:_REPORT]
        return "sent"


_watcher: ExitWatcher | None = None
_lock = threading.Lock()


def exit_watcher() -> ExitWatcher:
    """This process's watcher, started on first use."""
    global _watcher
    with _lock:
        if _watcher is None:
            _watcher = ExitWatcher()
        return _watcher


def _forget_in_child() -> None:
    global _watcher
    _watcher = None  # a forked child has no such thread
    _guarded.clear()  # nor its ident, which a thread of the child's could get


os.register_at_fork(after_in_child=_forget_in_child)
