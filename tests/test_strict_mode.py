"""SRTR_TEST_STRICT=1 turns every skip into a failure that names the test and its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
SKIPPING = """
import pytest

pytestmark = pytest.mark.filterwarnings("ignore")

def test_runs():
    pass

def test_needs_a_daemon():
    pytest.skip("no slurmctld here")

@pytest.mark.skipif(True, reason="never on this machine")
def test_marked():
    pass

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""


@pytest.mark.parametrize("strict", [True, False])
def test_skips_fail_only_in_strict_mode(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_skipping=SKIPPING)
    monkeypatch.setenv("SRTR_TEST_STRICT", "1" if strict else "0")
    result = pytester.runpytest_subprocess("-ra")
    if strict:
        # A skipif skips in setup: pytest counts the failed setup as an error.
        result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
        result.stdout.fnmatch_lines(
            [
                "*SRTR_TEST_STRICT=1, which forbids skips*never on this machine*",
                "*SRTR_TEST_STRICT=1, which forbids skips*no slurmctld here*",
                "ERROR test_skipping.py::test_marked*",
                "FAILED test_skipping.py::test_needs_a_daemon*",
            ]
        )
    else:
        result.assert_outcomes(passed=1, skipped=2, xfailed=1)


def test_a_module_that_skips_whole_fails_in_strict_mode(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_whole="import pytest\npytest.skip('no cluster', allow_module_level=True)\n"
    )
    monkeypatch.setenv("SRTR_TEST_STRICT", "1")
    result = pytester.runpytest_subprocess()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*forbids skips*no cluster*"])
