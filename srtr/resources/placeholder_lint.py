"""Warnings for `{word}` tokens that are probably misspelt placeholders (`{nodee}`).

Unknown braces are left as written (placeholders.py), which is right for shell `${VAR}`,
JSON in an argument and Python format strings, and silent for a typo: `{pool_ipp}` reaches
the program as is and rendezvous fails much later. So srtr warns, and never fails, when a
token is very likely a typo. The rule (docs/recipe.md, "Placeholders"):

- only in fields that are rendered (service `command`, `args`, `env`, `preamble`,
  `readiness.file.path`, `srun_export_env`; `environment`; a role's `command` and `env`;
  the frontend's `command`);
- only `{word}` with a lowercase word of letters, digits and `_` (what a placeholder looks
  like), not preceded by `$` (shell `${VAR}`) and not doubled (`{{word}}`, an escaped
  format field);
- only when the word is no placeholder and difflib finds one close to it (ratio >= 0.8):
  `{nodee}` → `{node}`, `{pool_ipp}` → `{pool_ip}`, `{poolip}` → `{pool_ip}`. A word close
  to no placeholder (`{name}`, `{x}`, `{port}`) is taken as meant.

Pure: the recipe in, problems out (paths without lines; the caller attaches them).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from srtr.resources.errors import Path, Problem
from srtr.resources.placeholders import KEYS
from srtr.resources.recipe import Recipe
from srtr.resources.workers import WORKER_KEYS

# Every key some instance can see: the common ones, the Mooncake ports, per-worker ones.
KNOWN = frozenset((*KEYS, "master_port", "metadata_port", "restart_count", *WORKER_KEYS))
CUTOFF = 0.8
_TOKEN = re.compile(r"(?<![${])\{([a-z][a-z0-9_]*)\}(?!\})")


def typos(text: str) -> list[tuple[str, str]]:
    """(word, the placeholder it is close to) for each likely typo in `text`, in order."""
    if "{" not in text:
        return []
    found = []
    for match in _TOKEN.finditer(text):
        word = match.group(1)
        if word in KNOWN:
            continue
        close = difflib.get_close_matches(word, sorted(KNOWN), n=1, cutoff=CUTOFF)
        if close:
            found.append((word, close[0]))
    return found


def warnings(recipe: Recipe) -> list[Problem]:
    """A warning for each likely placeholder typo in the rendered fields of `recipe`."""
    out = []
    for path, text in _rendered(recipe):
        for word, meant in typos(text):
            out.append(
                Problem(
                    path,
                    f"{{{word}}} is not a placeholder (did you mean {{{meant}}}?); "
                    "it is passed on as written",
                    warning=True,
                )
            )
    return out


def _rendered(recipe: Recipe) -> Iterator[tuple[Path, str]]:
    for index, service in enumerate(recipe.services):
        base: Path = ("services", index)
        yield from _items((*base, "command"), service.command or ())
        yield from _items((*base, "args"), service.args)
        yield from _values((*base, "env"), service.env)
        yield from _values((*base, "srun_export_env"), service.srun_export_env)
        if service.preamble:
            yield (*base, "preamble"), service.preamble
        file_probe = service.readiness.file if service.readiness else None
        if file_probe is not None:
            yield (*base, "readiness", "file", "path"), file_probe.path
    yield from _values(("environment",), recipe.environment)
    for name in ("prefill", "decode", "agg"):
        role = getattr(recipe.roles, name, None)
        if role is not None:
            yield from _items(("roles", name, "command"), role.command or ())
            yield from _values(("roles", name, "env"), role.env)
    yield from _items(("frontend", "command"), recipe.frontend.command or ())


def _items(path: Path, texts: Sequence[str]) -> Iterable[tuple[Path, str]]:
    return (((*path, i), text) for i, text in enumerate(texts))


def _values(path: Path, env: Mapping[str, str]) -> Iterable[tuple[Path, str]]:
    return (((*path, key), value) for key, value in env.items())
