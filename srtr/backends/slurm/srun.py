"""srun's command lines for the SLURM backend: one step per instance, one step of node
agents; pure (no processes are started here). `slurm_cmd` re-exports them, so every SLURM
command line is still `slurm_cmd.<name>`.

What shaped them (measured: docs/slurm-facts.md):

- `srun --export=ALL,K=V` splits values at commas, and argv is readable by every user of the
  machine (`ps`), so an instance's environment travels in the srun client's own environment
  (`srun_client_env`) with `--export=ALL`, which hands it to the task intact. Only variables
  that would steer srun itself go on the command line, as `env -- K=V ... CMD`. `env` also
  turns a missing command into exit code 127 (126: not executable); a bare srun reports 2
  (ENOENT) or 13 (EACCES) there.
- `srun --output` expands `%` patterns (`%%` is a literal `%`) and drops backslashes; stderr
  goes to the same file when `--error` is not given.
- When a node dies, the srun client of a step on it prints `srun: error: Node failure on NODE`
  and exits 0, so only `parse_srun_node_failure` tells that exit apart from a clean one.
- A step over several nodes survives the loss of one of them only with `--no-kill` (and the
  job's own `--no-kill`); then srun prints the same `Node failure` line and the step runs on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePath

_STEERING_PREFIXES = ("SLURM", "SRUN_", "SALLOC_", "SBATCH_", "PMI_", "PMIX_", "LD_", "GLIBC_")
_OPTION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_NODE_FAILURE_RE = re.compile(r"srun: error: Node failure on (\S+)")
# srun's and slurmstepd's words when the step's cgroup saw the OOM killer (the step state
# OUT_OF_MEMORY), in the wordings of several SLURM versions.
_OOM_RE = re.compile(
    r"srun: error: \S+: tasks? [0-9,-]+: Out Of Memory"
    r"|slurmstepd(?:-\S+)?: .*(?:Detected \d+ oom[-_]kill event|out-of-memory handler)"
)
_MIB = 1024 * 1024

# Options srun_argv sets itself; srun_options may not override them (the backend relies on them).
_RESERVED_SRUN_OPTIONS = frozenset(
    {
        "jobid",
        "overlap",
        "nodes",
        "N",
        "ntasks",
        "n",
        "nodelist",
        "w",
        "job-name",
        "J",
        "output",
        "o",
        "error",
        "e",
        "open-mode",
        "input",
        "i",
        "export",
    }
)


def srun_argv(
    *,
    job_id: str,
    node: str,
    step_name: str,
    log_path: PurePath | str,
    env: Mapping[str, str],
    argv: Sequence[str],
    preamble: str | None = None,
    shell: bool = False,
    container: str | None = None,
    pyxis: bool = False,
    cpus_per_task: int | None = None,
    cpu_bind: str | None = None,
    srun_options: Mapping[str, str] | None = None,
    cwd: PurePath | str | None = None,
    memory: int | None = None,
) -> list[str]:
    """One single-task step on `node` of allocation `job_id`, output appended to `log_path`.

    The environment is NOT on this command line: it travels in the srun client's own
    environment (`srun_client_env`, with `--export=ALL`), which only its owner can read, so
    no value shows in `ps`. The exception are the variables that would steer the srun client
    itself (`steers_srun`: SLURM_*, LD_*, PATH, ...): those of `env` are set on the node by
    `env -- K=V ... CMD`. `env` is always there, so a missing command exits 127 (not
    executable: 126). CMD is:

    - `argv` as is;
    - with `preamble`: `bash -c '<preamble>\\nexec "$@"' srtr-<name> argv...` (argv stays an
      argv, the preamble sees the environment);
    - with `shell`: `bash -c <argv[0]>` (argv must have exactly one element), or
      `bash -c '<preamble>\\n<argv[0]>'` with a preamble too, like the local backend.

    `container` becomes `--container-image=<image>` only when `pyxis` is true (the caller warns
    otherwise). `srun_options` entries become `--key=value` (`--key` when the value is ""); they
    may not replace the options this function sets. `cwd` becomes `--chdir`: note that
    slurmstepd falls back to /tmp when that directory does not exist, so check it first.
    `memory` (bytes, `limits.memory`) becomes `--mem` in whole MiB, rounded up.
    Raises ValueError for input that cannot be passed faithfully.
    """
    check_text("job id", job_id)
    check_text("node", node)
    check_text("step name", step_name)
    command = _command(step_name, argv, preamble, shell)
    out = ["srun", "--jobid", job_id, "--overlap", "-N1", "-n1", "-w", node]
    out += _output_options(step_name, log_path)
    if cwd is not None:
        check_text("cwd", str(cwd))
        out.append(f"--chdir={cwd}")
    out += _resource_options(container if pyxis else None, cpus_per_task, cpu_bind)
    if memory is not None:
        out.append(f"--mem={-(-memory // _MIB)}M")
    out += [_srun_option(key, value) for key, value in (srun_options or {}).items()]
    _check_env(env)
    out += ["env", "--", *(f"{k}={v}" for k, v in env.items() if steers_srun(k))]
    return out + command


def steers_srun(name: str) -> bool:
    """True for an environment variable that would change what the srun client itself does
    (its input variables SLURM_*, SRUN_*, PMI_*; the dynamic loader's LD_*; glibc's tunables;
    PATH, by which srun is found): an instance's value of it cannot ride in the client's
    environment, so `srun_argv` sets it on the node, on the command line."""
    return name == "PATH" or name.startswith(_STEERING_PREFIXES)


def srun_client_env(base: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """The srun client's environment for a step whose instance has environment `env`.

    `base` is the controller's environment: srun needs SLURM_CONF and PATH from it. Variables
    of an enclosing step (SLURM_*, SBATCH_*, SRUN_*, except SLURM_CONF) stay behind: they
    would override the step's own -N/-n/-w. Every variable of `env` that does not steer srun
    (`steers_srun`) is added; `--export=ALL` hands all of them to the task.
    """
    _check_env(env)
    out = {
        k: v
        for k, v in base.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) or k == "SLURM_CONF"
    }
    out.update((k, v) for k, v in env.items() if not steers_srun(k))
    return out


def srun_help_argv() -> list[str]:
    """`srun --help`: what this srun accepts; see parse_pyxis."""
    return ["srun", "--help"]


def parse_pyxis(help_text: str) -> bool:
    """True when `srun --help` lists `--container-image`, i.e. the pyxis plugin is there."""
    return "--container-image" in help_text


def parse_srun_node_failure(stderr: str) -> str | None:
    """The node named by `srun: error: Node failure on node3`, else None.

    srun exits 0 when the node of its step fails, so this is how a lost step is told apart
    from one that exited cleanly.
    """
    found = _NODE_FAILURE_RE.search(stderr)
    return found.group(1) if found else None


def parse_srun_oom(stderr: str) -> bool:
    """Whether srun's last words say the step's tasks met the OOM killer (SLURM's step
    state OUT_OF_MEMORY): `slurmstepd: error: Detected 1 oom_kill event in StepId=...`."""
    return _OOM_RE.search(stderr) is not None


def _command(step_name: str, argv: Sequence[str], preamble: str | None, shell: bool) -> list[str]:
    if shell:
        if len(argv) != 1:
            raise ValueError(
                f"a shell launch takes exactly one command line, got {len(argv)} arguments"
            )
        script = argv[0] if preamble is None else f"{preamble}\n{argv[0]}"
        _check_arg(script)
        return ["bash", "-c", script]
    if not argv:
        raise ValueError("empty argv")
    for arg in argv:
        _check_arg(arg)
    if preamble is not None:
        _check_arg(preamble)
        # The argv travels as "$@", so it is never split or expanded by the shell.
        return ["bash", "-c", preamble + '\nexec "$@"', "srtr-" + step_name, *argv]
    if "=" in argv[0]:
        # `env` would take it for one more NAME=VALUE; let bash exec it instead.
        return ["bash", "-c", 'exec "$@"', "srtr-" + step_name, *argv]
    return list(argv)


def _check_env(env: Mapping[str, str]) -> None:
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"invalid environment variable name {key!r}")
        if "\0" in value:
            raise ValueError(f"environment variable {key} contains a NUL byte")


def _output_options(step_name: str, log_path: PurePath | str) -> list[str]:
    return [
        f"--job-name={step_name}",
        f"--output={_output_pattern(log_path)}",
        "--open-mode=append",
        "--input=none",
        "--export=ALL",
    ]


def _resource_options(
    container: str | None, cpus_per_task: int | None, cpu_bind: str | None
) -> list[str]:
    out = []
    if container:
        check_text("container image", container)
        out.append(f"--container-image={container}")
    if cpus_per_task is not None:
        if cpus_per_task < 1:
            raise ValueError(f"cpus_per_task must be positive, got {cpus_per_task}")
        out.append(f"--cpus-per-task={cpus_per_task}")
    if cpu_bind:
        check_text("cpu_bind", cpu_bind)
        out.append(f"--cpu-bind={cpu_bind}")
    return out


def _output_pattern(log_path: PurePath | str) -> str:
    path = str(log_path)
    if not PurePath(path).is_absolute():
        # A relative name is resolved by slurmstepd, and a bare number means "task N only".
        raise ValueError(f"log path must be absolute, got {path!r}")
    if "\\" in path:
        # srun drops backslashes from --output (and then stops expanding %), so such a path
        # cannot be spelled.
        raise ValueError(f"log path cannot contain a backslash: {path!r}")
    check_text("log path", path)
    return path.replace("%", "%%")


def _srun_option(key: str, value: str) -> str:
    name = key.lstrip("-")
    if not _OPTION_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid srun option name {key!r}")
    # srun, like getopt_long, also takes an unambiguous prefix of a long option ("--out").
    if name in _RESERVED_SRUN_OPTIONS or (
        len(name) > 1 and any(r.startswith(name) for r in _RESERVED_SRUN_OPTIONS if len(r) > 1)
    ):
        raise ValueError(f"srun option --{name} is set by srtr and cannot be overridden")
    _check_arg(value)
    if len(name) == 1:
        return f"-{name}{value}" if value else f"-{name}"
    return f"--{name}={value}" if value else f"--{name}"


def check_text(what: str, value: str) -> None:
    """One-line values: SLURM prints them back on lines we parse."""
    if not value or any(c in value for c in "\0\n\r"):
        raise ValueError(f"invalid {what}: {value!r}")


def _check_arg(value: str) -> None:
    if "\0" in value:
        raise ValueError(f"argument contains a NUL byte: {value!r}")


def agents_srun_argv(
    *,
    job_id: str,
    nodes: Sequence[str],
    step_name: str,
    log_path: PurePath | str,
    command: Sequence[str],
    cpus_per_task: int | None = None,
) -> list[str]:
    """One step that runs `command` once on each of `nodes`: the node agents.

    `--no-kill` keeps the step running on the other nodes when one fails, and
    `--kill-on-bad-exit=0` when one agent dies. `cpus_per_task` (the nodes' CPU count) and
    `--mem=0` give the agents, and so the instances they start, the whole node where cgroups
    would confine a step to what it asked for. `--overlap` lets per-instance steps share the
    nodes. The environment (the token) is the srun client's own (`srun_client_env`).
    """
    check_text("job id", job_id)
    if not nodes:
        raise ValueError("no node to run agents on")
    for node in nodes:
        if "," in node:
            raise ValueError(f"invalid node name {node!r}")
        check_text("node", node)
    out = ["srun", "--jobid", job_id, "--overlap", "--no-kill", "--kill-on-bad-exit=0"]
    count = str(len(nodes))
    out += ["-N", count, "-n", count, "--ntasks-per-node=1", "-w", ",".join(nodes)]
    out += _output_options(step_name, log_path)
    out += _resource_options(None, cpus_per_task, None)
    out.append("--mem=0")
    if not command:
        raise ValueError("empty agent command")
    for arg in command:
        _check_arg(arg)
    return out + list(command)
