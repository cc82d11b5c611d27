"""Memory limits: the quantity syntax, the cgroup layouts, OOM verdicts, srun's --mem."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from srtr.backends import cgroups
from srtr.backends.base import LaunchSpec
from srtr.backends.procgroup import ExitStatus
from srtr.backends.slurm import cmd as slurm_cmd
from srtr.resources.limits import format_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("512Mi", 512 * 1024**2),
        ("1Gi", 1024**3),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("2G", 2 * 10**9),
        ("300M", 300 * 10**6),
        ("64k", 64_000),
        ("1048576", 1024**2),
        ("8Ki", 8192),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(text: str, count: int) -> None:
    assert parse_quantity(text) == count


@pytest.mark.parametrize("text", ["12x", "Mi", "1.2.3Gi", "-1Gi", "1 GB", "1K", ""])
def test_what_is_no_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(text)


def test_bytes_print_with_the_largest_binary_suffix() -> None:
    assert format_bytes(512 * 1024**2) == "512Mi"
    assert format_bytes(3 * 1024**3) == "3Gi"
    assert format_bytes(1000) == "1000"


def test_bad_limits_name_the_file_line_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srtr.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\nservices:\n  - name: a\n    command: [sleep, '1']\n    limits: {memory: 512MB}\n"
    )
    assert main(["plan", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:5: services[0].limits.memory: '512MB' is not a quantity" in err
    for bad, words in (("{memory: 512}", "at least 1Mi"), ("{cpu: 2}", "cpu")):
        recipe.write_text(
            f"name: t\nservices:\n  - name: a\n    command: [sleep, '1']\n    limits: {bad}\n"
        )
        assert main(["plan", str(recipe)]) == 2
        err = capsys.readouterr().err
        assert f"{recipe}:5: services[0].limits" in err and words in err, err


def test_a_limit_reaches_the_instance_spec(tmp_path: Path) -> None:
    from srtr.resources.expand import local_allocation
    from srtr.resources.planning import plan_text_source

    text = "name: t\nservices:\n  - name: a\n    command: [sleep, '1']\n    limits: {memory: 1Gi}\n"
    _, desired = plan_text_source(text, "r.yaml", local_allocation(1))
    (spec,) = desired.instances
    assert spec.memory_limit == 1024**3


# -- cgroups ---------------------------------------------------------------------------------


def v1_root(tmp_path: Path) -> Path:
    own = tmp_path / "memory" / "process_api" / "abc"
    own.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("max\n")
    return tmp_path


PROC_V1 = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def test_v1_cgroups_go_under_our_own_memory_cgroup(tmp_path: Path) -> None:
    found = cgroups.layout(v1_root(tmp_path), PROC_V1)
    assert isinstance(found, cgroups.Layout)
    assert found.version == 1
    assert found.parent == tmp_path / "memory/process_api/abc" / f"srtr-{os.getpid()}"
    assert found.oom_file == "memory.oom_control"


def test_v2_cgroups_need_the_memory_controller_delegated(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    mine = tmp_path / "user.slice" / "srtr.scope"
    mine.mkdir(parents=True)
    (mine / "cgroup.subtree_control").write_text("cpu\n")
    why = cgroups.layout(tmp_path, "0::/user.slice/srtr.scope\n")
    assert isinstance(why, str) and "not delegated" in why
    (mine / "cgroup.subtree_control").write_text("cpu memory\n")
    found = cgroups.layout(tmp_path, "0::/user.slice/srtr.scope\n")
    assert isinstance(found, cgroups.Layout)
    assert (found.version, found.limit_file, found.oom_file) == (2, "memory.max", "memory.events")


def test_no_memory_controller_is_said(tmp_path: Path) -> None:
    why = cgroups.layout(tmp_path, PROC_V1)
    assert isinstance(why, str) and "no memory cgroup controller" in why


def test_oom_kill_counts_are_read_from_each_file() -> None:
    assert cgroups.oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n") == 2
    assert cgroups.oom_kills("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n") == 1
    assert cgroups.oom_kills("nr_free_pages 1\noom_kill 7\n") == 7
    assert cgroups.oom_kills("") == 0


def spec(limit: int | None = 64 * 1024**2, attempt: int = 0) -> LaunchSpec:
    return LaunchSpec(
        name="service_a",
        node="node1",
        node_ip="127.0.0.2",
        argv=("python3", "-c", "x"),
        env={},
        log_path=Path("/dev/null"),
        attempt=attempt,
        memory_limit=limit,
    )


def test_a_limited_attempt_joins_its_cgroup_before_its_program(tmp_path: Path) -> None:
    groups = cgroups.MemoryCgroups(root=v1_root(tmp_path))
    groups._layout = cgroups.layout(tmp_path, PROC_V1)
    argv = groups.argv(spec(), ["python3", "-c", "x"])
    parent = tmp_path / "memory/process_api/abc" / f"srtr-{os.getpid()}"
    group = parent / "service_a.0"
    assert argv[:3] == ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"']
    assert argv[3:] == [str(group / "cgroup.procs"), "python3", "-c", "x"]
    assert (group / "memory.limit_in_bytes").read_text() == str(64 * 1024**2)
    assert (group / "memory.memsw.limit_in_bytes").read_text() == str(64 * 1024**2)
    # Unlimited instances are left alone.
    assert groups.argv(spec(limit=None), ["true"]) == ["true"]
    # The kernel counted an OOM kill in its cgroup: OOMKilled, whatever the code.
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    for name in os.listdir(group):
        if name != "memory.oom_control":
            (group / name).unlink()
    assert groups.reason("service_a", ExitStatus(137, 9, "killed by SIGKILL")) == "OOMKilled"


def test_without_a_limit_the_kernels_log_names_the_oom_killers_victim(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,1,-;an old record: Killed process 4242 (old) before we looked\n")
    groups = cgroups.MemoryCgroups()
    groups._kernel_log = cgroups.KernelLog(str(log))  # opened at its end, as /dev/kmsg
    with log.open("a") as handle:
        handle.write(
            "3,2,2,-;Memory cgroup out of memory: Killed process 8986 (python3) "
            "total-vm:82212kB, anon-rss:65104kB\n"
            "3,3,3,-;Out of memory: Killed process 77 (java) total-vm:1kB\n"
        )
    killed = ExitStatus(137, signal.SIGKILL, "killed by SIGKILL")
    assert groups.reason("service_a", killed, 8986) == "OOMKilled"
    assert groups.reason("service_b", killed, 4242) == ""  # logged before we looked
    groups.signalled("service_c", signal.SIGKILL)  # srtr's own SIGKILL, whatever the log says
    assert groups.reason("service_c", killed, 77) == ""
    assert groups.reason("service_d", ExitStatus(1, None, "exited with code 1"), 77) == ""
    assert cgroups.MemoryCgroups(enabled=False).reason("service_a", killed, 8986) == ""
    assert cgroups.oom_victims("Killed process 12 (x) total-vm") == [12]
    groups.close()


def test_an_unreadable_kernel_log_is_no_oom(tmp_path: Path) -> None:
    unreadable = cgroups.KernelLog(str(tmp_path / "missing"))
    assert not unreadable.oom_killed(1)


def test_where_cgroups_cannot_be_made_the_instance_runs_without_its_limit(
    tmp_path: Path,
) -> None:
    groups = cgroups.MemoryCgroups(root=tmp_path)  # no memory controller there
    assert groups.argv(spec(), ["python3"]) == ["python3"]
    assert cgroups.limits_warning([], simulated_nodes=True) is None
    assert cgroups.limits_warning(["a"], simulated_nodes=False) is None


# -- SLURM -----------------------------------------------------------------------------------


def test_the_step_launcher_asks_srun_for_the_memory() -> None:
    argv = slurm_cmd.srun_argv(
        job_id="12",
        node="n1",
        step_name="service_a",
        log_path="/run/logs/a.out",
        env={},
        argv=["python3"],
        memory=512 * 1024**2 + 1,
    )
    assert "--mem=513M" in argv
    assert not any(a.startswith("--mem") for a in argv[: argv.index("--mem=513M")])


def test_slurms_oom_words_are_recognised() -> None:
    new = (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=12.3. "
        "Some of the step tasks have been OOM Killed."
    )
    old = "slurmstepd: error: Detected 2 oom-kill event(s) in step 12.3 cgroup."
    assert slurm_cmd.parse_srun_oom("x\n" + new + "\nsrun: error: n1: task 0: Out Of Memory\n")
    assert slurm_cmd.parse_srun_oom(old)
    # What the test cluster's SLURM says (its log, as the step's output file has it).
    seen = (
        "allocating\nslurmstepd-node1: error: Detected 1 oom-kill event(s) in StepId=7.0. "
        "Some of your processes may have been killed by the cgroup out-of-memory handler.\n"
    )
    assert slurm_cmd.parse_srun_oom(seen)
    assert slurm_cmd.parse_srun_oom("srun: error: node1: task 0: Out Of Memory\n")
    assert not slurm_cmd.parse_srun_oom("srun: error: n1: task 0: Exited with exit code 1")


def test_the_start_warning_names_the_services_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "unavailable", lambda root=cgroups.CGROUP_ROOT: "no way")
    text = cgroups.limits_warning(["train", "api"], simulated_nodes=True)
    assert text == "limits.memory of train, api is not enforced: no way; they run without it"
    monkeypatch.setattr(cgroups, "unavailable", lambda root=cgroups.CGROUP_ROOT: None)
    assert cgroups.limits_warning(["train"], simulated_nodes=True) is None
