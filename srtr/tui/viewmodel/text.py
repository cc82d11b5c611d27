"""Times and exits as the TUI writes them: ages like kubectl's, exit codes with signal names."""

from __future__ import annotations

from srtr.tui.viewmodel.phases import Doc

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def fmt_age(seconds: float | None) -> str:
    """Age as kubectl prints it: `42s`, `3m7s`, `17m`, `4h12m`, `30h`, `3d4h`, `12d`.

    Coarser with age, which also means an old instance's cell rarely changes: at 4,096
    instances the table is not rewritten every second.
    """
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    minutes, hours = s // 60, s // 3600
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    return f"{hours // 24}d"


def age_since(at: float | None, now: float) -> str:
    return "" if at is None else fmt_age(now - at)


# Phases in which the current attempt no longer runs: its age stopped when it ended.
_ENDED_PHASES = frozenset({"Succeeded", "Failed", "Stopped", "Lost", "BackOff"})


def instance_age(inst: Doc, now: float) -> str:
    """How long the current attempt ran: up to now, or up to its end once it ended (the
    time of its exit in the history), so a finished instance's age does not keep growing."""
    return age_since(inst.get("started_at"), attempt_end(inst) or now)


def attempt_end(inst: Doc) -> float | None:
    """When the current attempt ended (wall seconds), or None while it runs (or unknown)."""
    if inst.get("phase") not in _ENDED_PHASES:
        return None
    history = inst.get("history") or []
    last = history[-1] if history else None
    if last is None or last.get("attempt") != inst.get("attempt"):
        return None
    at = last.get("at")
    return float(at) if isinstance(at, int | float) else None


def fmt_exit(code: int | None, signal: int | None = None, *, short: bool = False) -> str:
    """`0`, `3`, `143 (SIGTERM)` (short: `143 SIGTERM`); '' when it has not exited."""
    if code is None and signal is None:
        return ""
    if signal:
        name = _SIGNALS.get(signal, f"signal {signal}")
        if code is None:
            return name
        return f"{code} {name}" if short else f"{code} ({name})"
    return str(code)


def last_exit(inst: Doc, *, short: bool = False) -> str:
    """How the instance's last attempt ended (its history has the signal), or ''."""
    history = inst.get("history") or []
    if history:
        last = history[-1]
        if last.get("planned"):  # stopped for a restart a user or a rollout asked for
            return "restarted" if short else f"restarted: {last['planned']}"
        return fmt_exit(last.get("exit_code"), last.get("signal"), short=short)
    return fmt_exit(inst.get("exit_code"), short=short)


def middle_cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut in the middle with `…`: instance names
    differ at their end (`…_node12`), so the end is kept whole and a little more of it."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    tail = (width - 1) // 2 + (width - 1) % 2
    head = width - 1 - tail
    return text[:head] + "…" + text[len(text) - tail :]


def end_cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut at the end with `…`."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
