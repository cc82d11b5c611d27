"""A recipe readable by others exposes its secrets: `srtr up` warns (one line on stderr).

The run dir's copy (`recipe.yaml`) is 0600 in a 0700 dir, but the file the user wrote is as
its umask made it, often 0644. A value under a name that looks like a secret (`*TOKEN*`,
`*SECRET*`, `*PASSWORD*`, `*API_KEY*`, ...) in such a file can be read by every user of a
shared login node; srtr does not refuse it (the value may be a dummy), it says so.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from srtr.resources.recipe import Recipe

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|API_?KEY|PRIVATE_?KEY|CREDENTIAL|ACCESS_?KEY|AUTH)", re.I
)


def secret_paths(recipe: Recipe) -> list[str]:
    """Where the recipe holds a non-empty value under a secret-looking name, as
    `services[0].env.API_TOKEN`."""
    found: list[str] = []

    def walk(value: object, at: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                here = f"{at}.{key}" if at else str(key)
                if isinstance(item, str) and item.strip() and _SECRET_NAME.search(str(key)):
                    found.append(here)
                else:
                    walk(item, here)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{at}[{index}]")

    walk(recipe.model_dump(by_alias=True, exclude_defaults=True), "")
    return found


def exposure(path: Path, recipe: Recipe) -> str | None:
    """The warning for a recipe file others can read that holds secret-looking values."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return None
    if not mode & 0o044:
        return None
    found = secret_paths(recipe)
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")
    who = "other users" if mode & 0o004 else "its group"
    return (
        f"srtr: warning: {path} holds secret-looking values ({shown}) and {who} can read it "
        f"(mode {mode:04o}); `chmod 600 {path}` keeps them yours"
    )


def warn_if_exposed(path: Path, recipe: Recipe) -> None:
    warning = exposure(path, recipe)
    if warning is not None:
        print(warning, file=sys.stderr)
