"""The pure rooms stay light at run time: importing them never loads the TUI or file watching.

`lint-imports` checks the same boundaries statically (pyproject.toml, [tool.importlinter]);
this test catches what a static graph cannot see, such as an import done through importlib.
It runs in a fresh interpreter, so modules other tests already imported do not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Imports the package and every module below it, then lists the heavy modules that got loaded.
PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    importlib.import_module(info.name)
heavy = ("textual", "watchfiles")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def probe(code: str, *args: str) -> Any:
    """What `python -c CODE ARGS...` printed as JSON, run in a fresh interpreter."""
    env = dict(os.environ)
    # This checkout's srtr, whatever an editable install elsewhere points to.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("package", ["srtr.resources", "srtr.reconciler", "srtr.store"])
def test_pure_rooms_do_not_load_textual_or_watchfiles(package: str) -> None:
    loaded = probe(PROBE, package)
    assert "textual" not in loaded and "watchfiles" not in loaded
    assert loaded == [], f"importing {package} loaded {loaded}"


# `srtr plan` of a recipe, in-process; lists what it loaded of the machinery and the TUI.
PLAN_PROBE = """
import contextlib, io, json, sys
from srtr.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["plan", sys.argv[1]])
machinery = ("srtr.reconciler", "srtr.store", "srtr.controllers", "srtr.backends", "srtr.runtime")
machinery += ("srtr.tui", "srtr.net")
machinery += ("srtr.cli.run", "srtr.cli.status", "srtr.cli.logs", "srtr.cli.control_verbs")
machinery += ("srtr.cli.run_state", "srtr.cli.submit", "srtr.cli.run_dir", "srtr.cli.wait")
heavy = ("rich", "textual")
loaded = [m for m in sys.modules if m.startswith(machinery) or m.split(".")[0] in heavy]
print(json.dumps({"code": code, "loaded": sorted(loaded)}))
"""


def test_plan_loads_no_run_machinery() -> None:
    """`srtr plan` builds only srtr.cli's own verbs' parsers (cli.build_parser), and what
    it loads must not drag the run dir's modules (srtr.store) or rich into its start-up
    (nor srtr.cli.run's parsers, which `srtr up` builds)."""
    assert probe(PLAN_PROBE, str(ROOT / "examples" / "pools.yaml")) == {"code": 0, "loaded": []}


def test_no_import_circle_in_srtr() -> None:
    """No two modules of srtr import each other, however indirectly: a circle is where a
    room's rule starts to bend (the TYPE_CHECKING imports count too, as grimp reads them)."""
    import grimp

    graph = grimp.build_graph("srtr")
    circles = sorted(
        (module, other)
        for module in graph.modules
        for other in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=other, imported=module)
    )
    assert circles == [], f"import circles (module -> module that leads back): {circles}"
