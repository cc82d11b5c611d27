"""`source:`: a git checkout cloned before a service's build and launch, and its pin.

A rev must be immutable so that every launch of the job runs the same code; `resources/pins.py`
records the commit it named when the job was submitted.
"""

from __future__ import annotations

import re

from pydantic import field_validator, model_validator

from srtr.resources.spec import Spec, Text

# Refs that name a moving target: a checkout of them is not reproducible.
MUTABLE_REFS = ("main", "master", "HEAD", "develop", "trunk")
MUTABLE_REF_PREFIXES = ("refs/heads/", "origin/", "refs/remotes/")
# A full commit id: SHA-1 (40 hex) or SHA-256 (64 hex). Abbreviations cannot be pinned.
COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def is_commit(rev: str) -> bool:
    return COMMIT_RE.fullmatch(rev.lower()) is not None


class Source(Spec):
    """A git checkout cloned before the service's build and launch."""

    git: str
    rev: Text
    path: str | None = None
    # The commit `rev` named when the job was submitted (srtr pins it; see resources/pins.py).
    sha: Text | None = None

    @field_validator("git")
    @classmethod
    def _git(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source.git must name a repository URL")
        return v

    @field_validator("rev")
    @classmethod
    def _rev(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source.rev must not be empty")
        if v in MUTABLE_REFS or v.startswith(MUTABLE_REF_PREFIXES):
            raise ValueError(
                f"source.rev '{v}' is a branch; use an immutable ref "
                "(a full commit SHA, a tag, or refs/pull/<n>/head)"
            )
        if v.startswith("-") or any(c.isspace() for c in v):
            raise ValueError(f"source.rev '{v}' is not a git ref")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or v.startswith("/") or ".." in v.split("/")):
            raise ValueError("source.path must be a relative path inside the checkout")
        return v

    @field_validator("sha")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is not None and not is_commit(v):
            raise ValueError(f"source.sha '{v}' must be a full commit id (40 or 64 hex digits)")
        return v.lower() if v is not None else None

    @model_validator(mode="after")
    def _rev_is_its_own_pin(self) -> Source:
        if self.sha is not None and is_commit(self.rev) and self.sha != self.rev.lower():
            raise ValueError(f"source.sha '{self.sha}' differs from the commit source.rev names")
        return self

    @property
    def pin(self) -> str | None:
        """The commit to check out: `sha`, or `rev` when it is one; None: `rev` unpinned."""
        return self.sha or (self.rev.lower() if is_commit(self.rev) else None)
