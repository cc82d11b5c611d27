"""Program output made safe for a terminal: what `srtr logs` and `srtr status` print there.

A log is what a program wrote, and a program can write escape sequences that a terminal
obeys: a window title, the clipboard (OSC 52), the alternate screen, a line rewritten by
`\\r`. Written to a terminal, every control character but newline and tab is shown instead,
in caret notation (`^[` for ESC, `^M` for a carriage return, `^?` for DEL) and C1 controls as
`<U+009B>`, as the TUI does and as kubectl does since CVE-2021-25743. A pipe gets the bytes
as written, and so does `--raw`.

Lines end at `\\n` only (`lines`): `str.splitlines` also ends one at `\\r`, `\\f`, `\\x1c`...,
so a progress bar's `\\r` counted as lines in `--tail`.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


def clean_text(text: str) -> str:
    """`text` with every control character but newline and tab shown, not obeyed."""
    return _CONTROL.sub(_shown, text)


def clean(data: bytes) -> bytes:
    """`clean_text` over bytes (invalid UTF-8 is replaced, not passed to the terminal)."""
    return clean_text(data.decode("utf-8", "replace")).encode("utf-8")


def clean_doc(doc: Any) -> Any:
    """Every string in a JSON document cleaned (state.json's reasons, messages, names)."""
    if isinstance(doc, str):
        return clean_text(doc)
    if isinstance(doc, list):
        return [clean_doc(item) for item in doc]
    if isinstance(doc, dict):
        return {key: clean_doc(value) for key, value in doc.items()}
    return doc


def lines(text: str) -> list[str]:
    """`text` split after each `\\n` only, the ends kept (the last line may lack one)."""
    parts = text.split("\n")
    out = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out
