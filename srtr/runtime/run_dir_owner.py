"""The run dir is its owner's: made 0700 (with any parent srtr makes for it), and refused,
with one line, when the path is someone else's or a symbolic link.

A run dir holds the job's secrets (control.json's token, recipe.yaml's env values) and its
logs, which programs and srtr write into. Whoever else owns the directory at that path, or a
link there, would read them, or point a log at a file of the owner's (`~/.bashrc`). So:

- `make_private` (at `srtr up`): missing parents (`outputs/`) and the run dir are created
  0700 whatever the umask; an existing run dir must be the user's own directory, not a link;
- `recreate` (a run dir that vanished while the job runs): made only where the path is
  absent, never into whatever now holds the name, and its owner is checked after.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from srtr.resources.errors import Problem, RecipeError


def _refuse(path: Path, message: str) -> RecipeError:
    return RecipeError(str(path), [Problem((), message)])


def check_own(path: Path) -> None:
    """Refuse (RecipeError, one line) a path that is not the user's own directory."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise _refuse(path, f"cannot use it as a run dir: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(path, "is a symbolic link; give the run dir's real path")
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(path, "is not a directory")
    if info.st_uid != os.getuid():
        raise _refuse(
            path,
            f"belongs to another user (uid {info.st_uid}); a run dir must be your own: "
            "give another --run-dir",
        )


def make_private(run_dir: Path) -> None:
    """Create `run_dir` and its missing parents 0700; refuse a run dir that is not ours."""
    missing = []
    for path in (run_dir, *run_dir.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked below like any existing one
        except OSError as exc:
            raise _refuse(path, f"cannot create it: {exc.strerror}") from None
        os.chmod(path, 0o700, follow_symlinks=False)  # whatever the umask took away or added
    check_own(run_dir)


def recreate(run_dir: Path) -> None:
    """Make a vanished run dir again, only where nothing holds its path; raises OSError when
    the path is taken, or what holds it now is not the user's own directory."""
    for parent in reversed(run_dir.parents):  # outputs/ too may have been removed
        if not os.path.lexists(parent):
            os.mkdir(parent, 0o700)
    os.mkdir(run_dir, 0o700)  # FileExistsError: someone else's now, or a link: not used
    info = os.lstat(run_dir)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{run_dir} is not this user's own directory")
    os.chmod(run_dir, 0o700)
