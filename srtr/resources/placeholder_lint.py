"""Warnings for `{word}` tokens that are probably misspelt placeholders (`{nodee}`).

Unknown braces are left as written (placeholders.py), which is right for shell `${VAR}`,
JSON in an argument and Python format strings, and silent for a typo: `{pool_ipp}` reaches
the program as is and rendezvous fails much later. So srtr warns, and never fails, when a
token is very likely a typo. The rule (docs/recipe.md, "Placeholders"):

- only in fields that are rendered (service `command`, `args`, `env`, `preamble`, `setup`,
  `readiness.file.path`, `srun_export_env`, and the same of its `leader`; `environment`;
  a role's `command` and `env`;
  the frontend's `command`);
- only `{word}` with a lowercase word of letters, digits and `_` (what a placeholder looks
  like), not preceded by `$` (shell `${VAR}`) and not doubled (`{{word}}`, an escaped
  format field);
- only when the word is no placeholder and difflib finds one close to it (ratio >= 0.8):
  `{nodee}` → `{node}`, `{pool_ipp}` → `{pool_ip}`, `{poolip}` → `{pool_ip}`. A word close
  to no placeholder (`{name}`, `{x}`, `{port}`) is taken as meant;
- another pool's address, `{pool_ip:NAME}`, is known by its key (`{pool_ipp:NAME}` →
  `{pool_ip:NAME}`); a NAME that owns no pool is an error of the recipe rules, not a typo.

Pure: the recipe in, problems out (paths without lines; the caller attaches them).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from srtr.resources.errors import Path, Problem
from srtr.resources.liveness import Liveness
from srtr.resources.placeholders import KEYS
from srtr.resources.pool_refs import POOL_KEYS
from srtr.resources.recipe import Leader, Recipe
from srtr.resources.workers import WORKER_KEYS

# Every key some instance can see: the common ones, the Mooncake ports, per-worker ones.
KNOWN = frozenset((*KEYS, "master_port", "metadata_port", "restart_count", *WORKER_KEYS))
CUTOFF = 0.8
_TOKEN = re.compile(r"(?<![${])\{([a-z][a-z0-9_]*)(:[A-Za-z0-9_-]+)?\}(?!\})")


def typos(text: str) -> list[tuple[str, str]]:
    """(word, the placeholder it is close to) for each likely typo in `text`, in order."""
    if "{" not in text:
        return []
    found = []
    for match in _TOKEN.finditer(text):
        word, pool = match.group(1), match.group(2)
        # `{pool_ip:NAME}`: the key must be a pool key; NAME is checked with the pools.
        known = POOL_KEYS if pool else KNOWN
        if word in known:
            continue
        close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=CUTOFF)
        if close:
            found.append((word + (pool or ""), close[0] + (pool or "")))
    return found


def warnings(recipe: Recipe) -> list[Problem]:
    """A warning for each likely placeholder typo in the rendered fields of `recipe`."""
    out = []
    for path, text in rendered(recipe):
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


def rendered(recipe: Recipe) -> Iterator[tuple[Path, str]]:
    """(path, text) of every field of `recipe` whose placeholders are rendered."""
    for index, service in enumerate(recipe.services):
        base: Path = ("services", index)
        yield from _items((*base, "command"), service.command or ())
        yield from _items((*base, "args"), service.args)
        yield from _values((*base, "env"), service.env)
        yield from _values((*base, "srun_export_env"), service.srun_export_env)
        if service.preamble:
            yield (*base, "preamble"), service.preamble
        if service.setup:
            yield (*base, "setup"), service.setup
        file_probe = service.readiness.file if service.readiness else None
        if file_probe is not None:
            yield (*base, "readiness", "file", "path"), file_probe.path
        yield from _liveness((*base, "liveness"), service.liveness)
        if service.leader is not None:
            yield from _leader((*base, "leader"), service.leader)
    yield from _values(("environment",), recipe.environment)
    for name in ("prefill", "decode", "agg"):
        role = getattr(recipe.roles, name, None)
        if role is not None:
            yield from _items(("roles", name, "command"), role.command or ())
            yield from _values(("roles", name, "env"), role.env)
    yield from _items(("frontend", "command"), recipe.frontend.command or ())


def _leader(base: Path, leader: Leader) -> Iterator[tuple[Path, str]]:
    yield from _items((*base, "command"), leader.command or ())
    yield from _items((*base, "args"), leader.args or ())
    yield from _values((*base, "env"), leader.env)
    file_probe = leader.readiness.file if leader.readiness else None
    if file_probe is not None:
        yield (*base, "readiness", "file", "path"), file_probe.path
    yield from _liveness((*base, "liveness"), leader.liveness)


def _liveness(base: Path, liveness: Liveness | None) -> Iterator[tuple[Path, str]]:
    """The rendered fields of a liveness probe: the exec command, the heartbeat file."""
    if liveness is None:
        return
    if liveness.exec is not None:
        yield from _items((*base, "exec", "command"), liveness.exec.command)
    if liveness.file is not None:
        yield (*base, "file", "path"), liveness.file.path


def _items(path: Path, texts: Sequence[str]) -> Iterable[tuple[Path, str]]:
    return (((*path, i), text) for i, text in enumerate(texts))


def _values(path: Path, env: Mapping[str, str]) -> Iterable[tuple[Path, str]]:
    return (((*path, key), value) for key, value in env.items())
