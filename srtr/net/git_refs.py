"""Resolve services' `source.rev` to commits with `git ls-remote`: the `source.sha` srtr pins
(docs/recipe.md, "Pinning a rev to a commit").

The side-effect half of source pinning (the pure half is resources/pins.py): `srtr submit`
and `srtr up` of a new job ask each repository once, before anything is allocated, which
commit every rev names now. No retry: a repository that is down, unknown or refuses us is
the user's to fix, and they should hear it at once rather than after a back-off.
"""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from srtr.resources.errors import Problem, RecipeError
from srtr.resources.loading import attach_line, load_marked
from srtr.resources.pins import PINS_FILE, Pin, Pins, pins_json
from srtr.resources.recipe import Service
from srtr.store.persist import write_atomic

LS_REMOTE_TIMEOUT_SECONDS = 60.0


class GitRefError(Exception):
    """A rev that cannot be resolved; the message names the rev and why."""


def ls_remote(git: str, refs: Sequence[str], timeout: float) -> dict[str, str]:
    """ref → object id of each of `refs` (and their peeled `^{}` lines) that `git` has."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    # ssh must not stop to ask about a host key or a passphrase either.
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    # `--`: a URL starting with '-' is not an option of git.
    argv = ["git", "-c", "http.version=HTTP/1.1", "ls-remote", "--", git, *refs]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise GitRefError(f"git ls-remote got no answer within {timeout:g}s") from None
    except OSError as exc:  # git not installed
        raise GitRefError(f"git ls-remote cannot run: {exc}") from None
    if done.returncode != 0:
        raise GitRefError(_why(done.stderr) or f"git ls-remote exited {done.returncode}")
    found = {}
    for line in done.stdout.splitlines():
        sha, _, ref = line.partition("\t")
        if ref:
            found[ref.strip()] = sha.strip().lower()
    return found


def _why(stderr: str) -> str:
    """git's own reason: its first `fatal:` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("fatal:")]
    return (fatal or lines[-1:] or [""])[0]


def wanted(rev: str) -> list[str]:
    """The refs to ask for: a full ref as is; a bare name as a tag (and as a branch, only
    to say that it is one). Each with its peeled `^{}` line, which git lists only when
    asked: an annotated tag's own id is not a commit."""
    ref = rev if rev.startswith("refs/") else f"refs/tags/{rev}"
    branch = [] if rev.startswith("refs/") else [f"refs/heads/{rev}"]
    return [ref, f"{ref}^{{}}", *branch]


def commit_of(found: dict[str, str], rev: str, git: str) -> str:
    """The commit `rev` names among `found` (an annotated tag's is its peeled `^{}` line)."""
    ref = wanted(rev)[0]
    sha = found.get(f"{ref}^{{}}") or found.get(ref)
    if sha:
        return sha
    if not rev.startswith("refs/") and f"refs/heads/{rev}" in found:
        raise GitRefError(
            f"'{rev}' is a branch of {git}, not a tag; use an immutable ref "
            "(a full commit SHA, a tag, or refs/pull/<n>/head)"
        )
    what = "a ref" if rev.startswith("refs/") else "a tag"
    raise GitRefError(f"'{rev}' is not {what} of {git}")


def resolve(
    services: Sequence[tuple[int, Service]], timeout: float = LS_REMOTE_TIMEOUT_SECONDS
) -> tuple[dict[str, Pin], list[Problem]]:
    """Pins for `services` (index in the recipe, service), one ls-remote per repository.

    Problems are at `services[i].source.rev`, for the caller to attach lines to.
    """
    by_repo: dict[str, list[tuple[int, Service]]] = defaultdict(list)
    for index, service in services:
        assert service.source is not None
        by_repo[service.source.git].append((index, service))
    pins: dict[str, Pin] = {}
    problems: list[Problem] = []
    for git, members in by_repo.items():
        refs = sorted({ref for _, s in members for ref in wanted(_rev(s))})
        try:
            found = ls_remote(git, refs, timeout)
        except GitRefError as exc:
            problems += [_problem(i, f"'{_rev(s)}' cannot be resolved: {exc}") for i, s in members]
            continue
        for index, service in members:
            try:
                pins[service.name] = Pin(git, _rev(service), commit_of(found, _rev(service), git))
            except GitRefError as exc:
                problems.append(_problem(index, str(exc)))
    return pins, problems


def pin_services(services: Sequence[tuple[int, Service]], text: str, file: str) -> dict[str, Pin]:
    """`resolve` for services of the recipe in `text` (read from `file`).

    Raises:
        RecipeError: a rev that does not resolve, at its `services[i].source.rev` line.
    """
    pins, problems = resolve(services)
    if problems:
        _, marked = load_marked(text, file)
        raise RecipeError(file, [attach_line(p, marked) for p in problems])
    return pins


def _rev(service: Service) -> str:
    assert service.source is not None
    return service.source.rev


def _problem(index: int, message: str) -> Problem:
    return Problem(("services", index, "source", "rev"), message)


def save_pins(run_dir: Path, pins: Pins) -> None:
    """Record the job's source pins in its run dir (what an adoption plans with).

    Raises:
        OSError: it cannot be written.
    """
    write_atomic(run_dir / PINS_FILE, pins_json(pins))
