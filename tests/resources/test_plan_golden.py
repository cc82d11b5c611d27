"""Golden files: `srtr plan` of every recipe in examples/, as text and as `-o json`.

Each `examples/<name>.yaml` has `tests/resources/golden/<name>.txt` and
`tests/resources/golden/<name>.json`.
A new example fails here until its golden files exist. To (re)write them, run

    SRTR_UPDATE_GOLDEN=1 python3 -m pytest tests/resources/test_plan_golden.py

and read the diff before committing it: the files are the reviewed, expected plans.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from srtr.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SRTR_UPDATE_GOLDEN") == "1"
HOW = "SRTR_UPDATE_GOLDEN=1 python3 -m pytest tests/resources/test_plan_golden.py"
FORMATS = {"txt": "text", "json": "json"}


def plan_output(recipe: Path, output: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["plan", str(recipe), "-o", output])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""  # an example must plan without warnings
    return captured.out


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/*.yaml is empty"


@pytest.mark.parametrize("suffix", list(FORMATS))
@pytest.mark.parametrize("recipe", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_plan_matches_golden(recipe: Path, suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_output(recipe, FORMATS[suffix], capsys)
    if suffix == "json":
        json.loads(out)  # valid JSON, whatever else
    golden = GOLDEN / f"{recipe.stem}.{suffix}"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(out)
        return
    if not golden.exists():
        pytest.fail(
            f"no golden file {golden.relative_to(ROOT)} for examples/{recipe.name}; "
            f"create it with `{HOW}` and review it before committing",
            pytrace=False,
        )
    expected = golden.read_text()
    assert out == expected, (
        f"`srtr plan -o {FORMATS[suffix]} examples/{recipe.name}` changed; if the change is "
        f"intended, rewrite the golden files with `{HOW}` and review the diff"
    )


def test_no_stale_golden_files() -> None:
    """Every golden file belongs to an example (a renamed example leaves none behind)."""
    stems = {p.stem for p in EXAMPLES}
    stale = sorted(p.name for p in GOLDEN.glob("*") if p.stem not in stems)
    assert not stale, f"golden files without an example: {stale}"


def test_examples_have_a_header_comment() -> None:
    for recipe in EXAMPLES:
        first = recipe.read_text().splitlines()[0]
        assert first.startswith("# "), f"examples/{recipe.name} must start with a comment"


def test_examples_finish_by_themselves() -> None:
    """Later tests run every example end to end: each needs a benchmark or a terminal pool."""
    for recipe in EXAMPLES:
        plan = json.loads(_plan_json(recipe))
        ends = plan["benchmark"]["type"] == "custom" or plan["terminal_services"]
        assert ends, f"examples/{recipe.name} would hold until stopped"


def _plan_json(recipe: Path) -> str:
    from srtr.resources.planning import plan_file
    from srtr.resources.render import plan_json

    return json.dumps(plan_json(*plan_file(recipe)))
