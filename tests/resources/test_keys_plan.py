"""srtctl's keys `start: with_workers`, `source`/`build_command` and `srun_export_env`, at
plan level: srtctl's test cases ported (reference T-46, T-56..T-58, T-71, S-62, S-75) plus
srtr's own rules for them. What the steps do on real processes is in
tests/e2e/local/test_setup_keys.py and, for srun, tests/e2e/slurm/test_setup_keys.py.
"""

from __future__ import annotations

import textwrap

import pytest

from srtr.resources.diff import diff
from srtr.resources.expand import local_allocation
from srtr.resources.launchers import Launcher
from srtr.resources.objects import DesiredState, InstanceKind
from srtr.resources.planning import plan_text_source
from srtr.resources.render import plan_json, plan_text
from tests.resources.test_validation import check, problem


def plan(text: str, nodes: int | None = None) -> DesiredState:
    allocation = local_allocation(nodes) if nodes else None
    return plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)[1]


# --- source / build_command: validation (T-46, V-21, V-22, V-25) ------------------------------

SOURCE = """\
name: t
services:
  - name: router
    command: [./router]
    source: {{git: "https://example.com/r.git", rev: {rev}}}
    build_command: [make]
"""


@pytest.mark.parametrize("rev", ["main", "master", "HEAD", "refs/heads/feature", "origin/x"])
def test_a_branch_is_refused_as_source_rev(rev: str) -> None:
    line, path, message = problem(SOURCE.format(rev=rev))
    assert (line, path) == (5, "services[0].source.rev")
    assert "immutable ref" in message and f"'{rev}'" in message


@pytest.mark.parametrize(
    "rev", ["v1.0", "0123456789abcdef0123456789abcdef01234567", "refs/pull/12/head", "1234567"]
)
def test_a_sha_a_tag_or_a_pull_ref_is_accepted(rev: str) -> None:
    check(SOURCE.format(rev=rev), None)


@pytest.mark.parametrize(
    ("placement", "where"),
    [
        ("placement: {node: workers}", "workers"),
        ("placement: {node: compute}", "compute"),
        ("nodes: 1", "workers"),  # an owner, even of one node, cannot build (V-22)
    ],
)
def test_source_needs_a_single_node_placement(placement: str, where: str) -> None:
    text = f"""\
    name: t
    services:
      - name: router
        command: [./router]
        source: {{git: "file:///r", rev: v1}}
        {placement}
    """
    assert problem(text, nodes=2) == (
        5,
        "services[0].source",
        f"requires a single-node placement (head or infra); got placement.node='{where}'",
    )


@pytest.mark.parametrize("placement", ["head", "infra"])
def test_source_on_head_or_infra_plans(placement: str) -> None:
    text = SOURCE.format(rev="v1") + f"    placement: {{node: {placement}}}\n"
    check(text, None)


CASES = [
    pytest.param(
        "build_command: []",
        (
            4,
            "services[0].build_command",
            "if set, must be non-empty (omit it entirely instead)",
        ),
        id="v21-empty-build",
    ),
    pytest.param(
        'build_command: [make, ""]',
        (4, "services[0].build_command", "must not contain empty arguments"),
        id="build-empty-arg",
    ),
    pytest.param(
        "build_timeout_seconds: 0",
        (4, "services[0].build_timeout_seconds", "must be positive"),
        id="v25-build-timeout",
    ),
    pytest.param(
        'source: {git: "", rev: v1}',
        (4, "services[0].source.git", "must name a repository URL"),
        id="source-no-url",
    ),
    pytest.param(
        'source: {git: "file:///r", rev: v1, path: ../up}',
        (4, "services[0].source.path", "must be a relative path inside the checkout"),
        id="source-path-escapes",
    ),
    pytest.param(
        'source: {git: "file:///r", rev: "-x"}',
        (4, "services[0].source.rev", "'-x' is not a git ref"),
        id="source-rev-option",
    ),
    pytest.param(
        "srun_export_env: {LD_PRELOAD: /x.so}",
        (
            4,
            "services[0].srun_export_env.LD_PRELOAD",
            "would steer the srun client itself, so it cannot travel in srun's --export; "
            "set it in env instead",
        ),
        id="export-env-steering",
    ),
    pytest.param(
        'srun_export_env: {"1A": x}',
        (4, "services[0].srun_export_env", "env key '1A' is not a valid environment variable name"),
        id="export-env-name",
    ),
]


@pytest.mark.parametrize(("line", "expected"), CASES)
def test_key_rules(line: str, expected: tuple[int, str, str]) -> None:
    text = f"name: t\nservices:\n  - name: s\n    {line}\n    command: [a]\n"
    found = problem(text)
    assert found[:2] == expected[:2]
    assert expected[2] in found[2]


# --- source / build_command: what the plan describes (T-56, S-57) -------------------------------

ROUTER = """\
name: t
services:
  - name: router
    command: [./router, --port, "8000"]
    container: nvcr.io/router:1
    env: {MODE: fast}
    preamble: echo hi
    source: {git: "https://example.com/r.git", rev: v1.2, path: lib/router}
    build_command: [make, -j8]
    build_timeout_seconds: 7
"""


def test_clone_runs_on_the_bare_host_and_build_in_the_services_environment() -> None:
    state = plan(ROUTER)
    clone, build, router = (
        state.instance(n)
        for n in ("service_router.clone", "service_router.build", "service_router")
    )
    # T-56: the clone runs on the bare host (no image), with HTTP/1.1 and the rev
    assert clone.kind is InstanceKind.SETUP and clone.container is None and clone.shell
    assert "git -c http.version=HTTP/1.1 clone" in clone.argv[0]
    assert "fetch origin v1.2" in clone.argv[0] and "https://example.com/r.git" in clone.argv[0]
    assert dict(clone.env) == {"GIT_TERMINAL_PROMPT": "0"}
    assert clone.run_timeout_seconds == 1860  # 3*600+60, srtctl's
    # the build runs the argv unrendered, in the service's container and env, in the checkout
    assert build.argv == ("make", "-j8") and build.container == "nvcr.io/router:1"
    assert dict(build.env) == {"MODE": "fast"} and build.run_timeout_seconds == 7
    workdir = '"$SRTR_RUN_DIR"/services/router/src/lib/router'
    assert build.preamble == f"cd {workdir}"
    # ... and the service runs there too, after its own preamble's cd
    assert router.preamble == f"cd {workdir}\necho hi"
    # both steps are non-critical, never restart, on the service's node, logged apart
    for step, stem in ((clone, "clone"), (build, "build")):
        assert (step.critical, step.restart.policy, step.node) == (False, "never", router.node)
        assert step.log == f"logs/service_router.{stem}.out"
        assert step.probe is None and step.kind is InstanceKind.SETUP
    # T-56: no host path in the plan: the run dir is only known at run time
    assert "/tmp" not in clone.argv[0] and "$SRTR_RUN_DIR" in clone.argv[0]


def test_clone_then_build_then_the_service_each_gate_the_next() -> None:
    state = plan(ROUTER)
    stages = [(s.name, s.instances) for s in state.stages]
    assert stages == [
        ("after_frontend/router.clone", ("service_router.clone",)),
        ("after_frontend/router.build", ("service_router.build",)),
        ("after_frontend/router", ("service_router",)),
    ]


def test_plan_output_shows_source_and_build() -> None:
    recipe_text = textwrap.dedent(ROUTER)
    recipe, state = plan_text_source(recipe_text, "recipe.yaml", None)
    text = plan_text(recipe, state)
    assert "    source: https://example.com/r.git @ v1.2 / source.path: lib/router" in text
    assert "    build_command: make -j8 (timeout 7s)" in text
    assert "git clone https://example.com/r.git @ v1.2 -> services/router/src" in text
    doc = plan_json(recipe, state)
    kinds = {i["name"]: i["kind"] for i in doc["instances"]}
    assert kinds["service_router.clone"] == kinds["service_router.build"] == "setup"


def test_source_without_build_command_only_warns() -> None:
    state = plan(SOURCE.format(rev="v1").replace("    build_command: [make]\n", ""))
    assert "services[router]: source is cloned but no build_command builds it" in state.warnings
    assert [s.name for s in state.stages] == [
        "after_frontend/router.clone",
        "after_frontend/router",
    ]


def test_build_without_source_runs_where_the_service_runs() -> None:
    state = plan("name: t\nservices:\n  - name: s\n    command: [a]\n    build_command: [b]\n")
    build = state.instance("service_s.build")
    assert build.preamble is None and state.instance("service_s").preamble is None
    assert [s.name for s in state.stages] == ["after_frontend/s.build", "after_frontend/s"]


def test_setup_steps_are_no_scrape_targets_and_hold_no_port() -> None:
    text = ROUTER + "    readiness: {port: 8000}\n    metrics: {port: 8000}\n"
    state = plan(text)
    assert [e.instance for e in state.exporters] == ["service_router"]


# --- start: with_workers (S-15, S-62, S-75) ------------------------------------------------------

WITH_WORKERS = """\
name: t
roles:
  prefill: {nodes: 1, command: [prefill]}
  decode: {nodes: 2, command: [decode]}
frontend: {type: generic, command: [fe]}
services:
  - name: master
    command: [master]
    start: with_workers
    placement: {node: infra}
    readiness: {port: 8700}
  - name: donor
    command: [donor]
    start: with_workers
    placement: {node: decode}
    readiness: {file: {path: "/tmp/donor-{node}.ready"}}
  - name: early
    command: [early]
    start: before_workers
"""


def test_with_workers_services_launch_in_the_workers_stage_right_before_the_workers() -> None:
    state = plan(WITH_WORKERS)
    stages = [(s.name, s.phase, s.instances) for s in state.stages]
    assert stages == [
        ("before_workers/early", "before_workers", ("service_early",)),
        (
            "workers",
            "workers",
            (
                "service_master",
                "service_donor_node2",
                "service_donor_node3",
                "worker_prefill_0",
                "worker_decode_0",
                "worker_decode_1",
            ),
        ),
        ("frontend", "frontend", ("frontend",)),
    ]
    for name in ("service_master", "service_donor_node2", "service_donor_node3"):
        spec = state.instance(name)
        assert spec.deferred_probe and spec.stage == "workers"
        assert spec.shutdown_tier == 1  # S-75: with_workers is tier 1
    assert not state.instance("worker_decode_0").deferred_probe
    assert not state.instance("service_early").deferred_probe
    # the file probe is rendered per instance
    assert state.instance("service_donor_node3").probe.path == "/tmp/donor-node3.ready"  # type: ignore[union-attr]


def test_with_workers_without_roles_still_gates_before_the_later_phases() -> None:
    text = """\
    name: t
    services:
      - name: a
        command: [a]
        start: with_workers
      - name: b
        command: [b]
    """
    state = plan(text)
    assert [(s.name, s.instances) for s in state.stages] == [
        ("workers", ("service_a",)),
        ("after_frontend/b", ("service_b",)),
    ]


def test_with_workers_source_is_cloned_and_built_before_the_workers_stage() -> None:
    text = WITH_WORKERS.replace(
        "    start: before_workers\n",
        '    start: with_workers\n    source: {git: "file:///r", rev: v1}\n'
        "    build_command: [make]\n",
    )
    state = plan(text)
    names = [s.name for s in state.stages]
    assert names[:2] == ["with_workers/early.clone", "with_workers/early.build"]
    assert names[2] == "workers" and "service_early" in state.stages[2].instances


def test_with_workers_plan_line() -> None:
    recipe, state = plan_text_source(textwrap.dedent(WITH_WORKERS), "recipe.yaml", None)
    text = plan_text(recipe, state)
    assert "  master type=generic placement=infra start=with_workers critical=false" in text
    assert "tier=1" in text.split("  master ")[1].splitlines()[0]


# --- srun_export_env (T-71) ----------------------------------------------------------------------

EXPORT = """\
name: t
services:
  - name: dcgm
    command: [exporter]
    placement: {node: workers}
    env: {A: "1", B: "env"}
    srun_export_env: {B: "export-{node}", HF_TOKEN: secret}
roles:
  agg: {nodes: 2, command: [w]}
frontend: {type: generic}
"""


def test_srun_export_env_is_rendered_per_instance_and_kept_apart_from_env() -> None:
    state = plan(EXPORT)
    spec = state.instance("service_dcgm_node2")
    assert dict(spec.env) == {"A": "1", "B": "env"}
    assert dict(spec.export_env) == {"B": "export-node2", "HF_TOKEN": "secret"}
    assert state.instance("service_dcgm_node1").config_hash() != spec.config_hash()


def test_srun_export_env_is_masked_and_keeps_its_own_step_under_the_agent_launcher() -> None:
    recipe, state = plan_text_source(textwrap.dedent(EXPORT), "recipe.yaml", None)
    text = plan_text(recipe, state, Launcher.AGENT)
    assert "    srun_export_env.HF_TOKEN: ***" in text
    assert "    srun_export_env.B: export-{node}" in text
    doc = plan_json(recipe, state, Launcher.AGENT)
    record = next(i for i in doc["instances"] if i["name"] == "service_dcgm_node1")
    assert record["srun_export_env"] == {"B": "export-node1", "HF_TOKEN": "***"}
    assert record["launcher"] == "step"
    worker = next(i for i in doc["instances"] if i["name"] == "worker_agg_0")
    assert worker["launcher"] == "agent"


# --- live edits ----------------------------------------------------------------------------------


def test_a_live_edit_may_not_change_a_running_services_clone_or_build() -> None:
    old = plan(ROUTER)
    for edited in (
        ROUTER.replace("rev: v1.2", "rev: v1.3"),
        ROUTER.replace("build_command: [make, -j8]", "build_command: [make]"),
        ROUTER.replace("    build_command: [make, -j8]\n", ""),
    ):
        assert diff(old, plan(edited)).refused == (
            "services[router].source/build_command cannot change while the service runs; "
            "change them in a new run",
        )
    # the build's timeout alone is a live ("hot") change: it reruns nothing
    longer = diff(old, plan(ROUTER.replace("timeout_seconds: 7", "timeout_seconds: 9")))
    assert longer.refused == () and [c.name for c in longer.hot] == ["service_router.build"]


def test_a_live_edit_may_add_a_service_with_its_clone_and_build() -> None:
    base = "name: t\nservices:\n  - name: other\n    command: [o]\n"
    added = base + "\n".join(ROUTER.splitlines()[2:]) + "\n"
    found = diff(plan(base), plan(added))
    assert found.refused == ()
    assert [c.name for c in found.add] == [
        "service_router.clone",
        "service_router.build",
        "service_router",
    ]


def test_one_shot_steps_take_no_probe_of_their_service() -> None:
    """A clone, a build and a per-node setup run once and are judged by their exit: the
    service's liveness probe (an HTTP server the step never serves) must not kill them."""
    _, state = plan_text_source(
        textwrap.dedent(
            """\
            name: shots
            resources: {gpus_per_node: 0}
            services:
              - name: web
                command: [serve]
                nodes: 1
                build_command: [make]
                setup: echo staged
                readiness: {port: 8000}
                liveness: {http: {port: 8000, path: /healthz}}
            """
        ),
        "r.yaml",
    )
    steps = [s for s in state.instances if s.kind is InstanceKind.SETUP]
    assert {s.stage.rsplit(".", 1)[1] for s in steps} == {"build", "setup"}
    assert all(s.liveness is None and s.probe is None for s in steps)
    (web,) = [s for s in state.instances if s.service == "web" and s.kind is not InstanceKind.SETUP]
    assert web.liveness is not None
