"""Source pins: the commit each service's `source.rev` named when its job was submitted.

A tag can be moved (force-pushed) while a job waits in the queue, or between its start and
an adoption or a node replacement. srtr resolves every `rev` once per job (`srtr submit`, or
`srtr up` of a new job; net/git_refs.py does the network part) and keeps the answers in
the run dir's `source-pins.json`. Every planning of that job's recipe applies them (pure,
here), so the clone step always checks out the same commit and a live edit of an unrelated
field plans the very same clone step as before.

A pin is kept with the `git` and `rev` it was resolved from: it applies only while the
recipe still names them, so an edited `rev` is never checked out at another rev's commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srtr.resources.recipe import Recipe, Service
from srtr.resources.source import is_commit

PINS_FILE = "source-pins.json"


@dataclass(frozen=True)
class Pin:
    git: str
    rev: str
    sha: str


Pins = Mapping[str, Pin]  # service name → its pin


def unpinned(recipe: Recipe, pins: Pins) -> list[tuple[int, Service]]:
    """The (index, service) whose `rev` must be resolved: a source that neither the recipe
    (`sha`, or a commit as `rev`) nor a matching pin fixes to a commit."""
    out = []
    for index, service in enumerate(recipe.services):
        source = service.source
        if source is None or not service.enabled or source.pin is not None:
            continue
        if _matching(pins.get(service.name), service) is None:
            out.append((index, service))
    return out


def apply_pins(recipe: Recipe, pins: Pins) -> Recipe:
    """`recipe` with each pin as its service's `source.sha` (a `sha` in the recipe wins)."""
    if not pins:
        return recipe
    services = []
    for service in recipe.services:
        pin = _matching(pins.get(service.name), service)
        if pin is not None and service.source is not None and service.source.sha is None:
            source = service.source.model_copy(update={"sha": pin.sha})
            service = service.model_copy(update={"source": source})
        services.append(service)
    return recipe.model_copy(update={"services": services})


def _matching(pin: Pin | None, service: Service) -> Pin | None:
    source = service.source
    if pin is None or source is None or (pin.git, pin.rev) != (source.git, source.rev):
        return None
    return pin


def pins_json(pins: Pins) -> str:
    doc = {name: {"git": p.git, "rev": p.rev, "sha": p.sha} for name, p in sorted(pins.items())}
    return json.dumps(doc, indent=2) + "\n"


def parse_pins(text: str) -> dict[str, Pin]:
    """The pins of a `source-pins.json`.

    Raises:
        ValueError: the text is not such a file (a job must not silently lose its pins).
    """
    doc: Any = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    pins = {}
    for name, entry in doc.items():
        fields = entry if isinstance(entry, dict) else {}
        git, rev, sha = (fields.get(k) for k in ("git", "rev", "sha"))
        if not (isinstance(git, str) and isinstance(rev, str) and isinstance(sha, str)):
            raise ValueError(f"{name}: needs the strings git, rev and sha")
        if not is_commit(sha):
            raise ValueError(f"{name}: sha {sha!r} is not a full commit id")
        pins[str(name)] = Pin(git, rev, sha.lower())
    return pins
