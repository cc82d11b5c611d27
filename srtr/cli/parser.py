"""argparse as srtr's verbs use it: did-you-mean on a usage error, whole positive numbers."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with did-you-mean (Python 3.14's `suggest_on_error`, by hand: 3.11 has
    none): an unknown verb or option gets the closest known one, under the verb's usage."""

    def error(self, message: str) -> NoReturn:
        match = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(3))
            message += _suggest(match.group(2), choices)
        super().error(message)

    def unknown(self, extras: list[str]) -> NoReturn:
        """`srtr VERB --frob`: this verb's usage, and the option it most likely meant."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = "".join(_suggest(e.split("=", 1)[0], known) for e in extras if e.startswith("-"))
        self.error(f"unrecognized arguments: {' '.join(extras)}{hints}")


def _suggest(word: str, choices: Sequence[str]) -> str:
    import difflib  # only on a usage error: every verb's start-up would pay for it

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
