"""Source pins (srtctl S-07 `source.sha`): each `source.rev` is resolved to a commit once per
job and that commit is what every clone of the job checks out, even after the tag moves.

Plan-level tests need no network; resolution and the e2e tests use a real bare repository
over file:// and real `srtr up` processes (local backend).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srtr.cli import build_parser
from srtr.cli.submit import _submit_plan
from srtr.net import git_refs
from srtr.resources.diff import diff
from srtr.resources.errors import RecipeError
from srtr.resources.objects import DesiredState, InstanceKind
from srtr.resources.pins import PINS_FILE, Pin, apply_pins, parse_pins, pins_json, unpinned
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Recipe
from srtr.resources.render import plan_text
from tests.support.e2e_util import Run, events, instance, wait_for

SHA1 = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "89abcdef0123456789abcdef0123456789abcdef"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


class Remote:
    """A bare repository (the "server") and the work tree its commits and tags come from.

    v1 is a lightweight tag and v1a an annotated one, both on the first commit; the pull
    request ref refs/pull/1/head is the second commit; the branch `main` moves on to it.
    """

    def __init__(self, root: Path) -> None:
        self.work, self.bare = root / "work", root / "remote.git"
        self.work.mkdir()
        git(self.work, "init", "-q", "-b", "main")
        self.first = self._commit("first")
        git(self.work, "tag", "v1")
        git(self.work, "tag", "-a", "v1a", "-m", "annotated")
        self.second = self._commit("second")
        subprocess.run(
            ["git", "clone", "-q", "--bare", str(self.work), str(self.bare)],
            check=True,
            capture_output=True,
        )
        git(self.work, "push", "-q", str(self.bare), "HEAD:refs/pull/1/head")
        self.url = f"file://{self.bare}"

    def _commit(self, greeting: str) -> str:
        (self.work / "greeting").write_text(greeting + "\n")
        git(self.work, "add", ".")
        git(self.work, "commit", "-qm", greeting)
        return git(self.work, "rev-parse", "HEAD")

    def move_tag(self, tag: str = "v1") -> str:
        """Force-move `tag` to a new commit on the server; return that commit."""
        sha = self._commit(f"moved {tag}")
        git(self.work, "tag", "-f", tag, "HEAD")
        git(self.work, "push", "-q", "-f", str(self.bare), f"refs/tags/{tag}", "HEAD:main")
        return sha


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(tmp_path)


def plan(text: str, **kw: object) -> tuple[Recipe, DesiredState]:
    return plan_text_source(textwrap.dedent(text), "recipe.yaml", None, **kw)  # type: ignore[arg-type]


ROUTER = """
name: t
services:
  - name: other
    command: [sleep, "1000"]
  - name: router
    command: [./run]
    source: {{git: "https://example.com/r.git", rev: v1.2{extra}}}
    build_command: [make]
"""


def router(extra: str = "") -> str:
    return ROUTER.format(extra=extra)


def clone_argv(state: DesiredState) -> str:
    step = next(i for i in state.instances if i.kind is InstanceKind.SETUP and i.type == "clone")
    return step.argv[0]


# --- the recipe's `sha` ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (", sha: abc123", "'abc123' must be a full commit id (40 or 64 hex digits)"),
        (f", sha: {'g' * 40}", f"'{'g' * 40}' must be a full commit id"),
        (f", sha: '{SHA1}0'", f"'{SHA1}0' must be a full commit id"),
    ],
)
def test_a_sha_that_is_not_a_full_commit_id_is_refused(extra: str, message: str) -> None:
    with pytest.raises(RecipeError) as err:
        plan(router(extra))
    [line] = err.value.lines()
    assert line.startswith("recipe.yaml:8: services[1].source.sha: "), line
    assert message in line


def test_a_sha_other_than_the_commit_rev_names_is_refused() -> None:
    text = ROUTER.replace("rev: v1.2{extra}", f"rev: {SHA1}, sha: {SHA2}").format()
    with pytest.raises(RecipeError) as err:
        plan(text)
    assert err.value.lines() == [
        f"recipe.yaml:8: services[1].source: source.sha '{SHA2}' differs from the commit "
        "source.rev names"
    ]


def test_the_recipe_sha_is_the_pin_lower_cased_and_shown_by_plan() -> None:
    recipe, state = plan(router(f", sha: {SHA1.upper()}"))
    source = recipe.services[1].source
    assert source is not None and (source.sha, source.pin) == (SHA1, SHA1)
    assert f"fetch origin {SHA1}" in clone_argv(state)
    text = plan_text(recipe, state)
    assert f"    source: https://example.com/r.git @ v1.2 (pinned to {SHA1})" in text
    assert f"git clone https://example.com/r.git @ v1.2 (pinned to {SHA1}) ->" in text


def test_without_a_pin_plan_shows_and_fetches_the_rev() -> None:
    recipe, state = plan(router())
    assert "    source: https://example.com/r.git @ v1.2\n" in plan_text(recipe, state)
    assert "fetch origin v1.2\n" in clone_argv(state) and "pinned" not in clone_argv(state)


def test_a_commit_as_rev_is_its_own_pin_and_needs_no_lookup() -> None:
    recipe, _ = plan(ROUTER.replace("rev: v1.2{extra}", f"rev: {SHA1.upper()}").format())
    assert recipe.services[1].source is not None
    assert recipe.services[1].source.pin == SHA1
    assert unpinned(recipe, {}) == []


# --- pins applied by the pure planning -----------------------------------------------------------


def test_pins_apply_only_to_the_git_and_rev_they_were_resolved_from() -> None:
    url = "https://example.com/r.git"
    _, pinned = plan(router(), pins={"router": Pin(url, "v1.2", SHA1)})
    assert f"fetch origin {SHA1}" in clone_argv(pinned)
    for stale in (Pin(url, "v1.1", SHA1), Pin("https://example.com/fork.git", "v1.2", SHA1)):
        _, state = plan(router(), pins={"router": stale})
        assert SHA1 not in clone_argv(state)
    # a sha in the recipe wins over a pin
    _, state = plan(router(f", sha: {SHA2}"), pins={"router": Pin(url, "v1.2", SHA1)})
    assert f"fetch origin {SHA2}" in clone_argv(state) and SHA1 not in clone_argv(state)
    recipe, _ = plan(router())
    assert [s.name for _, s in unpinned(recipe, {})] == ["router"]
    assert unpinned(recipe, {"router": Pin(url, "v1.2", SHA1)}) == []
    assert apply_pins(recipe, {}) is recipe


def test_a_live_edit_of_another_service_keeps_the_pinned_clone_step() -> None:
    pins = {"router": Pin("https://example.com/r.git", "v1.2", SHA1)}
    _, old = plan(router(), pins=pins)
    _, new = plan(router().replace('[sleep, "1000"]', '[sleep, "2000"]'), pins=pins)
    assert diff(old, new).refused == ()
    # without the job's pins the same edit would be refused (the clone step would differ)
    _, unpinned_new = plan(router().replace('[sleep, "1000"]', '[sleep, "2000"]'))
    assert diff(old, unpinned_new).refused != ()


def test_the_pins_file_round_trips_and_a_broken_one_is_an_error() -> None:
    pins = {"router": Pin("https://example.com/r.git", "v1.2", SHA1)}
    assert parse_pins(pins_json(pins)) == pins
    for broken in ("[]", '{"router": {"git": "u", "rev": "v1"}}', '{"r": {"git": "u", '
                   '"rev": "v1", "sha": "abc"}}', "{"):  # fmt: skip
        with pytest.raises(ValueError):
            parse_pins(broken)


# --- resolution: git ls-remote against a real repository -----------------------------------------


def service(git_url: str, rev: str, name: str = "s") -> object:
    recipe, _ = plan(
        f"""
        name: t
        services:
          - name: {name}
            command: [x]
            source: {{git: "{git_url}", rev: "{rev}"}}
        """
    )
    return recipe.services[0]


def resolve_one(git_url: str, rev: str) -> tuple[dict[str, Pin], list[str]]:
    pins, problems = git_refs.resolve([(0, service(git_url, rev))])  # type: ignore[list-item]
    return pins, [p.message for p in problems]


def test_tags_and_pull_refs_resolve_to_their_commits(remote: Remote) -> None:
    for rev, sha in (
        ("v1", remote.first),
        ("v1a", remote.first),
        ("refs/pull/1/head", remote.second),
    ):
        assert resolve_one(remote.url, rev) == ({"s": Pin(remote.url, rev, sha)}, []), rev
    # the annotated tag's own object is not the commit: the peeled line is what counts
    assert git(remote.bare, "rev-parse", "v1a") != remote.first


def test_revs_that_do_not_resolve_are_named(remote: Remote, tmp_path: Path) -> None:
    assert resolve_one(remote.url, "v9") == ({}, [f"'v9' is not a tag of {remote.url}"])
    assert resolve_one(remote.url, "refs/pull/7/head") == (
        {},
        [f"'refs/pull/7/head' is not a ref of {remote.url}"],
    )
    git(remote.bare, "branch", "feature", remote.first)
    assert resolve_one(remote.url, "feature")[1] == [
        f"'feature' is a branch of {remote.url}, not a tag; use an immutable ref "
        "(a full commit SHA, a tag, or refs/pull/<n>/head)"
    ]
    gone = f"file://{tmp_path / 'gone.git'}"
    _, [message] = resolve_one(gone, "v1")
    assert message.startswith("'v1' cannot be resolved: fatal: ")
    assert "does not appear to be a git repository" in message


# --- srtr up / submit refuse what does not resolve, before anything runs --------------------------


def srtr(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("verb", ["up", "submit"])
def test_up_and_submit_refuse_a_rev_that_does_not_resolve(
    remote: Remote, tmp_path: Path, verb: str
) -> None:
    for url, rev, why in (
        (remote.url, "v9", f"'v9' is not a tag of {remote.url}"),
        (f"file://{tmp_path / 'gone.git'}", "v1", "'v1' cannot be resolved: fatal: "),
    ):
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(
            f'name: t\nservices:\n  - name: s\n    command: [x]\n    source: {{git: "{url}", '
            f"rev: {rev}}}\n"
        )
        run_dir = tmp_path / "run"
        done = srtr(verb, str(recipe), "--run-dir", str(run_dir), cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert f"{recipe}:5: services[0].source.rev: {why}" in done.stderr
        assert "Traceback" not in done.stderr
        assert not run_dir.exists()  # refused before the run dir (and any allocation)


# --- e2e: the job checks out its pin, however the tag moves ---------------------------------------

JOB = """
name: pinned
services:
  - name: tool
    command: ["bash", "-c", "echo hello from $(cat greeting); exec sleep 1000"]
    source: {{git: "{url}", rev: v1}}
    readiness: {{log: {{pattern: hello}}, interval_seconds: 0.05}}
  - name: other
    command: ["sleep", "{seconds}"]
"""


def job(remote: Remote, seconds: int = 1000) -> str:
    return JOB.format(url=remote.url, seconds=seconds)


def running(run: Run) -> dict:
    return run.wait_state(
        lambda s: s["job"]["phase"] == "Running" and all(i["identity"] for i in s["instances"]
                                                        if i["kind"] != "setup"),
        60,
        "the job to run",
    )  # fmt: skip


def checked_out(run: Run) -> str:
    return git(run.run_dir / "services" / "tool" / "src", "rev-parse", "HEAD")


def clone_launches(run: Run) -> int:
    return sum(
        e["reason"] == "Launched" and e["object"] == "instance/service_tool.clone"
        for e in events(run.run_dir)
    )


def stop(run: Run) -> None:
    run.signal(signal.SIGINT)
    run.finish()


@pytest.mark.e2e
def test_up_pins_the_tag_and_a_live_edit_after_it_moves_is_applied(
    remote: Remote, tmp_path: Path
) -> None:
    run = Run(tmp_path, job(remote))
    try:
        before = instance(running(run), "service_other")["pid"]
        assert json.loads((run.run_dir / PINS_FILE).read_text()) == {
            "tool": {"git": remote.url, "rev": "v1", "sha": remote.first}
        }
        log = (run.run_dir / "logs" / "service_tool.clone.out").read_text()
        assert f"srtr: v1 is pinned to {remote.first}" in log
        assert f"srtr: checked out {remote.first}" in log
        assert checked_out(run) == remote.first
        remote.move_tag()
        run.recipe.write_text(textwrap.dedent(job(remote, seconds=2000)))
        run.wait_state(
            lambda s: (
                s["job"]["observed_generation"] == 2
                and instance(s, "service_other")["phase"] == "Running"
                and instance(s, "service_other")["pid"] not in (None, before)
            ),
            60,
            "the edit of `other` to be applied (restarting it)",
        )
        applied = [e["message"] for e in events(run.run_dir) if e["reason"] == "RecipeApplied"]
        assert applied == ["generation 2: 1 restart [~service_other]"]
        assert "RecipeRejected" not in [e["reason"] for e in events(run.run_dir)]
        assert clone_launches(run) == 1 and checked_out(run) == remote.first
    finally:
        stop(run)


LATE = """
  - name: late
    command: ["bash", "-c", "echo late from $(cat greeting); exec sleep 1000"]
    source: {{git: "{url}", rev: {rev}}}
    readiness: {{log: {{pattern: late}}, interval_seconds: 0.05}}
"""


@pytest.mark.e2e
def test_a_service_a_live_edit_adds_is_pinned_then(remote: Remote, tmp_path: Path) -> None:
    run = Run(tmp_path, job(remote))
    try:
        running(run)
        run.recipe.write_text(textwrap.dedent(job(remote)) + LATE.format(url=remote.url, rev="v9"))
        wait_for(
            lambda: any(e["reason"] == "RecipeRejected" for e in events(run.run_dir)),
            60,
            "the edit with a rev that does not resolve to be rejected",
        )
        [rejected] = [e for e in events(run.run_dir) if e["reason"] == "RecipeRejected"]
        assert (
            f"{run.recipe}:13: services[2].source.rev: 'v9' is not a tag of {remote.url}"
            in rejected["message"]
        )
        run.recipe.write_text(textwrap.dedent(job(remote)) + LATE.format(url=remote.url, rev="v1a"))
        run.wait_state(
            lambda s: any(
                i["name"] == "service_late" and i["phase"] == "Ready" for i in s["instances"]
            ),
            60,
            "the late service to be ready",
        )
        pins = parse_pins((run.run_dir / PINS_FILE).read_text())
        assert pins["late"] == Pin(remote.url, "v1a", remote.first)
        assert pins["tool"] == Pin(remote.url, "v1", remote.first)
        log = (run.run_dir / "logs" / "service_late.clone.out").read_text()
        assert f"srtr: v1a is pinned to {remote.first}" in log
        assert "late from first" in (run.run_dir / "logs" / "service_late.out").read_text()
    finally:
        stop(run)


GATED = """
name: gated
services:
  - name: gate
    start: infra
    command: ["bash", "-c", "while [ ! -e {go} ]; do sleep 0.05; done; echo go; exec sleep 1000"]
    readiness: {{log: {{pattern: go}}, interval_seconds: 0.05, timeout_seconds: 300}}
  - name: tool
    command: ["bash", "-c", "echo hello from $(cat greeting); exec sleep 1000"]
    source: {{git: "{url}", rev: v1}}
    readiness: {{log: {{pattern: hello}}, interval_seconds: 0.05}}
"""


@pytest.mark.e2e
def test_adoption_after_the_tag_moved_clones_the_pin(remote: Remote, tmp_path: Path) -> None:
    """The controller dies before the clone step ran; the tag moves; the adopting
    controller runs the clone, and it checks out the job's pin."""
    go = tmp_path / "go"
    run = Run(tmp_path, GATED.format(go=go, url=remote.url), "--adopt-window", "60")
    try:
        run.wait_state(
            lambda s: instance(s, "service_gate")["identity"], 60, "the gate to be launched"
        )
        run.proc.kill()  # kill -9 the controller
        run.wait(30)
        remote.move_tag()
        second = run.adopt()
        run.wait_state(lambda s: s["job"]["controller_pid"] == second.pid, 60, "the new controller")
        go.touch()
        run.wait_state(
            lambda s: instance(s, "service_tool")["phase"] == "Ready", 60, "the tool to be ready"
        )
        assert clone_launches(run) == 1 and checked_out(run) == remote.first
        assert "hello from first" in (run.run_dir / "logs" / "service_tool.out").read_text()
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


@pytest.mark.e2e
def test_a_job_pinned_at_submit_checks_out_the_pin_not_the_moved_tag(
    remote: Remote, tmp_path: Path
) -> None:
    # The run dir `srtr submit` makes for the batch job, by submit's own code up to sbatch
    # (sbatch needs the SLURM test cluster); the batch job's `srtr up` is run here locally.
    recipe, run_dir = tmp_path / "submitted.yaml", tmp_path / "submitted"
    recipe.write_text(textwrap.dedent(job(remote)))
    args = build_parser().parse_args(["submit", str(recipe), "--run-dir", str(run_dir)])
    assert _submit_plan(args)[2] == run_dir.resolve()
    assert parse_pins((run_dir / PINS_FILE).read_text()) == {
        "tool": Pin(remote.url, "v1", remote.first)
    }
    moved = remote.move_tag()  # while the job waits in the queue
    run = Run(tmp_path, job(remote), run_dir=run_dir)
    try:
        running(run)
        assert checked_out(run) == remote.first != moved
        assert "hello from first" in (run.run_dir / "logs" / "service_tool.out").read_text()
        assert "pinning source revs" not in run.stderr_so_far()  # not resolved again
    finally:
        stop(run)


@pytest.mark.e2e
def test_a_pin_the_server_no_longer_has_fails_the_clone_instead_of_building_the_tag(
    remote: Remote, tmp_path: Path
) -> None:
    run_dir = tmp_path / "submitted"
    run_dir.mkdir()
    (run_dir / PINS_FILE).write_text(pins_json({"tool": Pin(remote.url, "v1", SHA1)}))
    run = Run(tmp_path, job(remote), run_dir=run_dir)
    assert run.finish(60) == 1, run.out + run.err
    log = (run_dir / "logs" / "service_tool.clone.out").read_text()
    assert (
        f"services[tool] source: v1 is now {remote.first}, not the {SHA1} srtr pinned for "
        "this job" in log
    )
    assert not (run_dir / "logs" / "service_tool.out").exists()
