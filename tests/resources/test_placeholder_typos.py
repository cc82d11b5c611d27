"""Placeholder typos (`{nodee}`) are warned about with file:line and a did-you-mean; legit
braces (shell `${VAR}`, JSON, format strings) are not (issue 23, item 12)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srtr.resources.placeholder_lint import KNOWN, typos
from srtr.resources.planning import plan_text_source


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--rank={nodee}", [("nodee", "node")]),
        ("{pool_ipp}:29500", [("pool_ipp", "pool_ip")]),
        ("{poolip}", [("poolip", "pool_ip")]),
        ("{head_ipp} {nod}", [("head_ipp", "head_ip"), ("nod", "node")]),
        ("{pool_node_cnt}", [("pool_node_cnt", "pool_node_count")]),
    ],
)
def test_likely_typos_are_found_with_the_placeholder_meant(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert typos(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "${HOME}/bin",  # shell
        "${nodee}",  # shell, however close to a placeholder
        '{"node": 1, "index": 2}',  # JSON
        "{{node_x}}",  # an escaped format field
        "print('{name} {x} {port} {rank}'.format(**v))",  # format fields near no placeholder
        "{node} {pool_ip} {index} {worker_gpus} {master_port}",  # real placeholders
        "{NODE}",  # not lowercase: not placeholder-shaped
    ],
)
def test_legit_braces_are_not_warned_about(text: str) -> None:
    assert typos(text) == []


def test_every_documented_placeholder_is_known() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "recipe.md").read_text()
    table = doc.split("### Placeholders", 1)[1].split("### ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `{")]
    documented = set(re.findall(r"`\{([a-z_]+)\}`", "".join(rows)))
    assert documented and documented <= KNOWN


RECIPE = """\
name: t
environment:
  MASTER: "{head_ipp}"
services:
  - name: train
    command: ["torchrun", "--master-addr={pool_ipp}", '{"a": 1}']
    preamble: 'echo ${HOME} {name}'
    env: {X: "{nod}"}
    nodes: 2
"""


def test_plan_warns_with_file_line_and_path_in_line_order_and_still_plans() -> None:
    _, state = plan_text_source(textwrap.dedent(RECIPE), "r.yaml")
    assert state.line_warnings == (
        "r.yaml:3: warning: environment.MASTER: {head_ipp} is not a placeholder "
        "(did you mean {head_ip}?); it is passed on as written",
        "r.yaml:6: warning: services[0].command[1]: {pool_ipp} is not a placeholder "
        "(did you mean {pool_ip}?); it is passed on as written",
        "r.yaml:8: warning: services[0].env.X: {nod} is not a placeholder "
        "(did you mean {node}?); it is passed on as written",
    )
    assert len(state.instances) == 2  # a warning, not a failure


def test_srtr_plan_prints_the_warnings_on_stderr_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "plan", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"{path}:6: warning: services[0].command[1]: {{pool_ipp}} is not a placeholder" in (
        done.stderr
    )
    assert "Instances (2)" in done.stdout


HOLD = """\
name: hold
services:
  - name: s
    command: ["sleep", "1000"]
    env: {A: "{nodee}"}
"""


@pytest.mark.e2e
def test_srtr_up_and_a_live_edit_record_the_warnings_and_run_on(tmp_path: Path) -> None:
    import signal

    from tests.support.e2e_util import Run, events, wait_for

    def warned(word: str) -> bool:
        return any(
            e["reason"] == "PlanWarning" and f"{{{word}}} is not a placeholder" in e["message"]
            for e in events(run.run_dir)
        )

    run = Run(tmp_path, HOLD)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        assert warned("nodee")
        run.recipe.write_text(HOLD.replace("{nodee}", "{pool_ipp}"))
        wait_for(lambda: warned("pool_ipp"), 30, "the live edit's warning")
        state = run.wait_state(lambda s: s["job"]["generation"] == 2, 30, "the edit applied")
        assert state["job"]["phase"] == "Running"
    finally:
        run.signal(signal.SIGTERM)
        run.finish()


def test_liveness_fields_are_linted_the_leaders_too() -> None:
    recipe = textwrap.dedent(
        """\
        name: lint
        resources: {gpus_per_node: 0}
        services:
          - name: pool
            nodes: 2
            command: [serve]
            liveness: {file: {path: "/tmp/{nodee}.beat", max_age_seconds: 30}}
            leader:
              command: [lead]
              liveness: {exec: {command: [ping, "{node_ipp}"]}}
        """
    )
    _, state = plan_text_source(recipe, "r.yaml")
    text = "\n".join(state.line_warnings)
    assert "services[0].liveness.file.path: {nodee} is not a placeholder" in text
    assert "services[0].leader.liveness.exec.command[1]: {node_ipp}" in text
