"""The TUI's colour themes: srtr's three names, or any Textual theme, from `--theme` or
SRTR_THEME; `c` cycles through srtr's three.

- `dark` (the default) and `light`: Textual's own dark and light themes.
- `terminal`: the terminal's own colours (Textual's `ansi-dark` theme: the terminal's
  default background and foreground and its 16 ANSI colours), for terminals whose palette
  the user chose, light or dark, and for terminals without true colour.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

ENV = "SRTR_THEME"
THEMES: dict[str, str] = {"dark": "textual-dark", "light": "textual-light", "terminal": "ansi-dark"}
DEFAULT = "dark"


class ThemeError(ValueError):
    """An unknown theme name; the text says which names there are."""


def resolve(
    name: str | None,
    available: Iterable[str] | None = None,
    env: Mapping[str, str] = os.environ,
) -> str:
    """The Textual theme for `name` (None: SRTR_THEME, else the default).

    Raises ThemeError for a name that is neither srtr's nor one of `available` (default:
    Textual's own, imported only then: `srtr up` checks the name before it starts, and
    Textual is the TUI process's to import, not the controller's).
    """
    chosen = name if name is not None else (env.get(ENV) or DEFAULT)
    if chosen in THEMES:
        return THEMES[chosen]
    if available is None:
        from textual.theme import BUILTIN_THEMES

        available = BUILTIN_THEMES
    known = set(available)
    if chosen in known:
        return chosen
    where = "--theme" if name is not None else ENV
    raise ThemeError(
        f"{where}: unknown theme {chosen!r}; use {', '.join(THEMES)} or a Textual theme "
        f"({', '.join(sorted(known - set(THEMES.values())))})"
    )


def following(current: str) -> str:
    """The Textual theme after `current` in srtr's cycle (dark, light, terminal)."""
    cycle = list(THEMES.values())
    if current not in cycle:
        return cycle[0]
    return cycle[(cycle.index(current) + 1) % len(cycle)]


def short_name(theme: str) -> str:
    """srtr's name of a Textual theme, or the Textual name itself."""
    return next((short for short, full in THEMES.items() if full == theme), theme)
