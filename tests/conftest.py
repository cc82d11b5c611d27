"""Shared test setup: xdist groups, the SLURM cluster fixture, and strict mode.

With SRTR_TEST_STRICT=1 (set by .ci/run), a skipped test is a failed test: CI must not be
green with whole parts untested because a daemon or a binary was missing. The failure names
the test and the reason it would have skipped. Without it, skips stay skips, with reasons
(`-ra` lists them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The end-to-end folders: a test there shares the machine-wide resource even when a marker
# was forgotten.
E2E = Path(__file__).resolve().parent / "e2e"

STRICT = os.environ.get("SRTR_TEST_STRICT") == "1"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`scripts/test` runs `-n 3 --dist loadgroup`), tests that share a
    machine-wide resource run one at a time on one worker: the SLURM tests share the test
    cluster's nodes, and the local end-to-end tests share the simulated nodes' loopback
    IPs and the fixed ports their recipes (the examples, as written) listen on. A test is in
    a group by its marker or by its folder (tests/e2e/slurm, tests/e2e/local). The other
    tests spread over the workers."""
    for item in items:
        folder = item.path.resolve().parent
        if item.get_closest_marker("slurm") is not None or folder.is_relative_to(E2E / "slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("e2e") is not None or folder.is_relative_to(E2E / "local"):
            item.add_marker(pytest.mark.xdist_group("local"))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """The local SLURM test cluster: reused when up (scripts/test starts it), else started
    here and stopped at the end unless another session still uses it (`slurm_util.hold`).
    Skips (a failure in strict mode) only when SLURM cannot be installed at all. Yields the
    environment to run SLURM commands with."""
    from tests.support import slurm_util

    held = slurm_util.hold()
    started = False
    try:
        if not slurm_util.cluster_up():
            reason = slurm_util.start()
            if reason:
                pytest.skip(reason)
            started = True
        yield {**os.environ}
    finally:
        slurm_util.release(held, stop=started)


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """pytest's tmp_path, except for tests marked `slurm`: a dir under the cluster dir that
    every node sees at the same path (a node's /tmp is its own on the separate-hosts
    cluster: a run dir there would be split between the nodes). Removed after a pass."""
    if request.node.get_closest_marker("slurm") is None:
        yield tmp_path
        return
    from tests.support import slurm_util

    shared = slurm_util.shared_dir(request.node.name)
    yield shared
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.passed:
        shutil.rmtree(shared, ignore_errors=True)


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_skip(report: Any) -> None:
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under SRTR_TEST_STRICT=1, which forbids skips: {_reason(report)}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    _fail_skip(report)
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]  # tmp_path reads it


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_skip(outcome.get_result())  # type: ignore[attr-defined]
