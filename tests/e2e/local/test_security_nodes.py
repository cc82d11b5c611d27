"""A node's /tmp keeps the host's protection: sticky and world-writable (1777), so with
`fs.protected_symlinks` on, another user's symlink planted in the host's /tmp cannot redirect
the job's writes onto the owner's files."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e_util import Run
from tests.support.security_util import Attacker, attacker  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

SYSCTL = Path("/proc/sys/fs/protected_symlinks")

RECIPE = """
name: sticky
services:
  - name: probe
    command:
      - bash
      - -c
      - |
        echo "mode $(stat -c %a /tmp)"
        if echo overwritten > /tmp/{link} 2>/dev/null
        then echo "write followed"
        else echo "write refused"
        fi
    terminal: true
"""


@pytest.fixture
def protected_symlinks() -> Iterator[None]:
    try:
        before = SYSCTL.read_text()
        SYSCTL.write_text("1")
    except OSError as exc:
        pytest.skip(f"cannot turn fs.protected_symlinks on: {exc}")
    try:
        yield
    finally:
        SYSCTL.write_text(before)


def test_a_planted_symlink_in_tmp_is_refused_on_a_node(
    attacker: Attacker,  # noqa: F811
    protected_symlinks: None,
    tmp_path: Path,
) -> None:
    secret = tmp_path / "owner-file"
    secret.write_text("the owner's\n")
    secret.chmod(0o600)
    link = f"srtr-planted-{uuid.uuid4().hex[:8]}"
    # Another user plants /tmp/<link> -> the owner's file, in the host's /tmp.
    attacker.run(
        "import os, sys; os.symlink(sys.argv[1], '/tmp/' + sys.argv[2])", str(secret), link
    )
    try:
        run = Run(tmp_path, RECIPE.format(link=link))
        assert run.finish() == 0, run.err
        out = (run.run_dir / "logs" / "service_probe.out").read_text()
        isolation = (run.run_dir / "nodes" / "isolation.txt").read_text()
    finally:
        os.unlink(f"/tmp/{link}")
    if "own /tmp" not in isolation:
        pytest.skip(f"no node view on this host: {isolation.strip()}")
    assert "mode 1777" in out
    assert "write refused" in out
    assert secret.read_text() == "the owner's\n"
