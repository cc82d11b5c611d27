"""Another local user, for the tests that try to disturb a job without its credentials.

The tests run as root, so "another user" is a real unprivileged account (`ATTACKER`, made
here with useradd when missing) and the attack a subprocess of the system's Python under
`setpriv --reuid --regid --clear-groups`: it has the uid a user on a shared login node would
have, none of the job's files, and only the standard library. Where that cannot be arranged
(not root, no setpriv or useradd) the test is skipped with the reason (a failure under
SRTR_TEST_STRICT=1, as CI runs).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ATTACKER = "srtr-attacker"
PYTHON = "/usr/bin/python3"  # readable by every user (root's pyenv is not)


@dataclass(frozen=True)
class Attacker:
    uid: int
    gid: int

    def argv(self, script: str, *args: str) -> list[str]:
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--",
            PYTHON,
            "-c",
            textwrap.dedent(script),
            *args,
        ]

    def run(self, script: str, *args: str, timeout: float = 120.0) -> str:
        """Run `script` as the attacker; its stdout (it must exit 0)."""
        done = subprocess.run(
            self.argv(script, *args), capture_output=True, text=True, timeout=timeout, cwd="/"
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, script: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(script, *args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )


def _account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
        capture_output=True,
        check=False,
    )
    return pwd.getpwnam(ATTACKER)  # made here, or by a test running beside this one


@pytest.fixture(scope="session")
def attacker() -> Attacker:
    if os.geteuid() != 0:
        pytest.skip("making another local user needs root")
    for tool in ("setpriv", "useradd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: no other user to attack as")
    if not Path(PYTHON).exists():
        pytest.skip(f"{PYTHON} is missing: the attacker has no Python")
    try:
        entry = _account()
    except KeyError:
        pytest.skip(f"useradd could not make the user {ATTACKER}")
    return Attacker(entry.pw_uid, entry.pw_gid)
