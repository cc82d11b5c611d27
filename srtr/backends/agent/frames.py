"""The bytes an agent sends on its one connection: its stream, and heartbeat frames between.

Agent → controller, the connection carries the channel's stream (TLS records; lines in the
clear, where tests run the protocol alone) and, at the stream's record (or line) boundaries,
two things of its own, told apart by their first byte, which no TLS record (content types
20-24) and no line of JSON starts with:

- a **heartbeat**: `BEAT_FRAME` and an 8-byte tag, `beat_tag(key, n)` for the session's nth
  heartbeat, `key` being a secret of the session (`Welcome.beat_key`, sent inside TLS). The
  controller notices a heartbeat arrive without reading it (`channel`, "Heartbeats") and
  checks the tags when it reads the connection, every few heartbeats: a tag that is wrong
  (forged, replayed, or out of order) ends the connection as a lost node's. No decrypt per
  heartbeat: a TLS record costs one (~3 µs), a tag a keyed BLAKE2b (~0.5 µs).
- a **doorbell** (`BELL`): the agent sends it as TCP urgent data after each message, so that
  the controller's loop, which watches its agents' sockets for urgent data only, wakes for
  messages and never for heartbeats. The kernel keeps an urgent byte out of the stream,
  except when a second one arrives before the first was read: then the first is delivered
  in line, at the boundary after the message it followed, and `Splitter` drops it.

Pure (hashlib only): the agent and the controller both import it.
"""

from __future__ import annotations

import hashlib

BEAT_FRAME = 0x00
BELL = 0x01
TAG = 8  # bytes of a heartbeat's tag
KEY = 16  # bytes of a session's heartbeat key
_HEADER = 5  # a TLS record's header: type, version (2), length (2)
_FRAME = 1 + TAG


class ForgedBeat(ValueError):
    """A heartbeat frame whose tag is not the session's next one."""


def beat_tag(key: bytes, n: int) -> bytes:
    """The tag of the session's `n`th heartbeat (from 0)."""
    return hashlib.blake2b(n.to_bytes(8, "big"), key=key, digest_size=TAG).digest()


def beat(key: bytes, n: int) -> bytes:
    """The whole frame of the session's `n`th heartbeat."""
    return bytes((BEAT_FRAME,)) + beat_tag(key, n)


class Splitter:
    """Splits what an agent sent into its stream and its heartbeats (checking their tags)."""

    def __init__(self, key: bytes, *, tls: bool) -> None:
        self.key = key
        self._tls = tls
        self._pending = b""  # the start of a frame or of a record header
        self._left = 0  # bytes of the current TLS record still to come
        self._in_line = False  # in the clear: within a line
        self.beats = 0  # heartbeats checked so far

    def feed(self, data: bytes | memoryview) -> bytes:
        """The stream's bytes among `data`; counts its heartbeats (`beats`).

        Raises:
            ForgedBeat: a heartbeat's tag is wrong.
        """
        buf = self._pending + bytes(data) if self._pending else bytes(data)
        self._pending = b""
        if not (self._left or self._in_line) and _only_beats(buf):
            return self._beats_only(buf)
        out: list[bytes] = []
        i, n = 0, len(buf)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                out.append(buf[i : i + take])
                i += take
                self._left -= take
            elif self._in_line:
                end = buf.find(b"\n", i)
                stop = n if end < 0 else end + 1
                out.append(buf[i:stop])
                self._in_line = end < 0
                i = stop
            elif buf[i] == BELL:
                i += 1
            elif buf[i] == BEAT_FRAME:
                if n - i < 1 + TAG:
                    break
                i = self._beat(buf, i)
            elif not self._tls:
                self._in_line = True
            elif n - i < _HEADER:
                break
            else:
                self._left = _HEADER + int.from_bytes(buf[i + 3 : i + 5], "big")
        self._pending = buf[i:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _beats_only(self, buf: bytes) -> bytes:
        """`feed` of whole heartbeat frames and nothing else (an idle agent's bytes between
        two reads): their framing checked with bytes operations, one tag (the last's)."""
        count = len(buf) // _FRAME
        if buf[-TAG:] != beat_tag(self.key, self.beats + count - 1):
            raise ForgedBeat(f"heartbeat {self.beats + count - 1} has a wrong tag")
        self.beats += count
        return b""

    def _beat(self, buf: bytes, i: int) -> int:
        """Count the heartbeat frame at `i`; where the next thing starts.

        Only the last whole frame of a run is checked (one tag a read, not one each): a
        frame's place fixes its number, so a frame a forger inserts shifts the numbers of
        those after it and the last one's tag is wrong, or it is the last itself; one that
        replaces a frame of the agent's in place adds no heartbeat."""
        j = i + 1 + TAG
        if len(buf) - j < 1 + TAG or buf[j] != BEAT_FRAME:
            if buf[i + 1 : j] != beat_tag(self.key, self.beats):
                raise ForgedBeat(f"heartbeat {self.beats} has a wrong tag")
        self.beats += 1
        return j


def _only_beats(buf: bytes) -> bool:
    """Whether `buf` is whole heartbeat frames only: every 9th byte, from the first, is a
    frame's marker. (A tag may hold any byte; its place, not its value, makes it a tag.)"""
    return bool(buf) and len(buf) % _FRAME == 0 and not buf[::_FRAME].strip(b"\x00")
