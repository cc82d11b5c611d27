"""Long chaos and fuzz runs; not part of the normal test run.

    python3 -m pytest -m chaos tests/chaos -p no:cacheprovider
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_fuzz import fuzz_edits, fuzz_recipes
from test_reliability import run_chaos

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
def test_chaos_60s_on_64_instances(tmp_path: Path) -> None:
    run_chaos(tmp_path, 60)


@pytest.mark.timeout(1800)
def test_fuzz_10000_recipes() -> None:
    fuzz_recipes(int(os.environ.get("SRTR_FUZZ_CASES", "10000")))


@pytest.mark.timeout(1800)
def test_fuzz_10000_live_edits() -> None:
    fuzz_edits(int(os.environ.get("SRTR_FUZZ_CASES", "10000")))
