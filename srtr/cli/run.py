"""The verbs that run a job: up (also `up --adopt`) and submit.

`up` is the only place that picks a backend, creates the run dir and starts the loop. The
verbs that look at a run dir (status, logs, tui, down) are in `status.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from srtr.cli import StoppedBySignal, control_verbs, status
from srtr.cli import bad as _bad
from srtr.cli.status import read_run

# The planning verbs' imports (pydantic, the recipe model: 0.1-0.3 s) stay in their functions:
# `srtr status` from a login node must not pay for them (benchmarks/control.py). The run
# dir's (srtr.reconciler) do too: every verb builds this module's parsers, `srtr plan` included.

if TYPE_CHECKING:
    from srtr.backends.agent.backend import AgentBackend
    from srtr.backends.base import Backend
    from srtr.backends.certs import JobCert
    from srtr.backends.loopback import LoopbackBlock
    from srtr.backends.provision import Provisioner, RequestState
    from srtr.backends.slurm import SlurmBackend
    from srtr.backends.slurm_provision import SlurmProvisioner
    from srtr.reconciler.rundir import RunState
    from srtr.resources.pins import Pin
    from srtr.resources.recipe import Recipe
    from srtr.runtime.guard import Started

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_by_signal(signum: int, _frame: object) -> None:
    raise StoppedBySignal(signum)


def _startup_signals() -> None:
    """Until `run_job` takes over, SIGTERM/SIGHUP unwind like Ctrl+C does: an allocation
    srtr asked for is released, and `srtr up` exits 128 + signal instead of dying at once."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_by_signal)


def add_verbs(verbs: Any) -> None:
    """The verbs that run a job (`up`, `submit`) and those that look at one (`cli.status`)."""
    _add_up(verbs.add_parser("up", help="run a recipe until its job ends"))
    _add_submit(verbs.add_parser("submit", help="submit a batch job that runs `srtr up` (sbatch)"))
    status.add_verbs(verbs)
    control_verbs.add_verbs(verbs)


def _add_up(up: argparse.ArgumentParser) -> None:
    up.add_argument("recipe", nargs="?", help="recipe YAML file (optional with --adopt)")
    up.add_argument(
        "--adopt",
        metavar="RUN_DIR",
        help="take over the job of a crashed controller: adopt what still runs, 0 restarts",
    )
    up.add_argument(
        "--adopt-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long instances outlive a crashed controller, waiting to be adopted (60)",
    )
    up.add_argument(
        "--backend",
        choices=("auto", "local", "slurm"),
        default="auto",
        help="where instances run; auto: slurm inside an allocation, local otherwise",
    )
    up.add_argument(
        "--launcher",
        choices=("auto", "process", "step", "agent"),
        default="auto",
        help="how instances start: process (local), step (an srun step each, SLURM), or "
        "agent (a node agent per node starts them); auto: process locally, agent on SLURM "
        "(instances SLURM must set up keep their own step)",
    )
    _add_slurm_flags(up, "SLURM {what} when srtr allocates (default: resources.*)")
    up.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="nodes to simulate (local) or to allocate (slurm); default: what the recipe needs",
    )
    up.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where state, events and logs go (default outputs/<name>-<UTC time>)",
    )
    _add_reuse(up)
    _add_up_watching(up)
    up.set_defaults(func=cmd_up)


def _add_up_watching(up: argparse.ArgumentParser) -> None:
    """How `up` shows the job, takes live edits and serves its metrics."""
    up.add_argument(
        "--headless",
        action="store_true",
        help="plain progress lines instead of the TUI (the default when stdout is not a terminal)",
    )
    up.add_argument(
        "--theme",
        metavar="NAME",
        help="the TUI's colours: dark (default), light, terminal (its own), or a Textual "
        "theme; default $SRTR_THEME",
    )
    up.add_argument(
        "--apply",
        choices=("auto", "confirm"),
        help="live edits of the recipe: apply at once (default headless) or after a yes "
        "in the TUI (default there)",
    )
    up.add_argument(
        "--watch-poll",
        action="store_true",
        help="poll the recipe file instead of inotify (automatic on NFS, Lustre, GPFS)",
    )
    # Hollow mode, a testing and benchmark tool (docs/agents.md): one process simulates every
    # node's agent and instances. Hidden: it runs nothing of the user's.
    up.add_argument("--hollow", action="store_true", help=argparse.SUPPRESS)
    up.add_argument("--no-watch", action="store_true", help="ignore edits of the recipe file")
    up.add_argument(
        "--metrics-port",
        metavar="[HOST:]PORT",
        type=_metrics_listen,
        help="serve srtr's own Prometheus metrics there (0: a free port; the URL is in "
        "state.json job.metrics_url)",
    )


def _add_submit(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("recipe", help="recipe YAML file")
    submit.add_argument(
        "--nodes", type=int, metavar="N", help="nodes to ask for (default: what the recipe needs)"
    )
    submit.add_argument(
        "--run-dir",
        metavar="DIR",
        help="run dir on the shared filesystem (default outputs/<name>-<UTC>)",
    )
    _add_reuse(submit)
    _add_slurm_flags(submit, "SLURM {what} (default: resources.*)")
    submit.set_defaults(func=cmd_submit)


def _add_reuse(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reuse-run-dir",
        action="store_true",
        help=f"a --run-dir that holds an ended run: move its files into {PREVIOUS_RUNS}/N "
        "and start a new run there (without it, such a run dir is refused)",
    )


def _add_slurm_flags(parser: argparse.ArgumentParser, help_text: str) -> None:
    """--partition, --account and --time; `help_text` names the flag's meaning as {what}."""
    for flag, what in (
        ("--partition", "partition"),
        ("--account", "account"),
        ("--time", "time limit"),
    ):
        parser.add_argument(
            flag, metavar=what.upper().replace(" ", "_"), help=help_text.format(what=what)
        )


def _metrics_listen(text: str) -> tuple[str, int]:
    from srtr.runtime.metrics import parse_listen

    return parse_listen(text)


def _make_run_dir(args: argparse.Namespace, name: str) -> Path:
    return _create_run_dir(_run_dir_path(args, name))


def _run_dir_path(args: argparse.Namespace, name: str) -> Path:
    """The run dir `up` will use, refused when a running job has it; not created yet."""
    from srtr.reconciler.rundir import STATE_FILE

    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        run_dir = Path("outputs") / f"{name}-{stamp}"
    if (run_dir / STATE_FILE).exists():
        state = read_run(run_dir)
        running = None if state.ended else controller_running(run_dir)
        if running:
            raise _bad("--run-dir", f"{run_dir} belongs to a running job ({running})")
        if not getattr(args, "reuse_run_dir", False):
            # Two runs in one dir would mix: a second Started, the old logs appended to,
            # the old recipe overwritten (issue 23).
            raise _bad(
                "--run-dir",
                f"{run_dir} holds another run ({_run_summary(run_dir, state)}); give another "
                f"--run-dir, or --reuse-run-dir to move its files aside into "
                f"{run_dir / PREVIOUS_RUNS}/",
            )
    return run_dir


def controller_running(run_dir: Path) -> str | None:
    """How a controller of `run_dir` is known to run (for the refusal), or None."""
    from srtr.cli.crash import beating_heartbeat

    heartbeat = beating_heartbeat(run_dir)
    if heartbeat is None:
        return None
    return f"its controller, pid {heartbeat.pid} on {heartbeat.host}, beats"


# Where --reuse-run-dir moves the files of the run dir's earlier runs: RUN_DIR/previous/N.
PREVIOUS_RUNS = "previous"


def _run_summary(run_dir: Path, state: RunState) -> str:
    from srtr.cli.crash import killed_by_guard

    job = state.job
    killed = killed_by_guard(run_dir, state)
    if killed is not None:
        return f"job {job.get('name')}: {killed}"
    ended = job.get("ended_at")
    when = f" at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ended))}" if ended else ""
    return f"job {job.get('name')}, {state.phase}{when}, exit code {job.get('exit_code')}"


def _set_aside(run_dir: Path) -> Path | None:
    """Move the files of the ended run in `run_dir` into `previous/N`: the new run starts
    clean, and nothing of the old one (its logs above all) is truncated or lost."""
    from srtr.reconciler.rundir import STATE_FILE

    if not (run_dir / STATE_FILE).exists():
        return None
    previous = run_dir / PREVIOUS_RUNS
    previous.mkdir(exist_ok=True, mode=0o700)
    taken = {int(p.name) for p in previous.iterdir() if p.name.isdigit()}
    target = previous / str(max(taken, default=0) + 1)
    target.mkdir(mode=0o700)
    for entry in run_dir.iterdir():
        if entry.name != PREVIOUS_RUNS:
            entry.rename(target / entry.name)
    print(f"srtr: moved the previous run's files to {target}", file=sys.stderr)
    return target


def _create_run_dir(run_dir: Path) -> Path:
    # The run dir holds env values (recipe.yaml, state.json): only its owner may read it.
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _set_aside(run_dir)  # only an ended run's, with --reuse-run-dir (_run_dir_path)
    run_dir.chmod(0o700)
    (run_dir / "logs").mkdir(exist_ok=True)
    return run_dir


def _backend_kind(args: argparse.Namespace) -> str:
    if args.backend != "auto":
        return str(args.backend)
    from srtr.backends.slurm import in_allocation

    return "slurm" if in_allocation() else "local"


def _launcher(args: argparse.Namespace, kind: str) -> str:
    """The launcher `up` runs with; refuses one the backend does not have."""
    native = "step" if kind == "slurm" else "process"
    if args.hollow:
        if kind != "local" or args.launcher not in ("auto", "agent"):
            raise _bad("--hollow", "hollow agents simulate nodes of the local backend only")
        return "agent"
    default = "agent" if kind == "slurm" else native  # SLURM: one srun step for the agents
    launcher = default if args.launcher == "auto" else str(args.launcher)
    if launcher not in (native, "agent"):
        raise _bad("--launcher", f"the {kind} backend has no {launcher!r} launcher")
    return launcher


def _agent_backend(
    kind: str,
    backend: Backend,
    run_dir: Path,
    window: float,
    cert: JobCert,
    *,
    adopt: bool = False,
    hollow: bool = False,
    grown: Sequence[str] = (),
) -> AgentBackend:
    """Wrap the chosen backend: its nodes get node agents (SLURM: one srun step of them),
    and SLURM keeps a step for the instances that need one. `adopt`: the agents of the
    crashed controller of `run_dir` rejoin instead (the token is the run dir's)."""
    from srtr.backends.agent.backend import AgentBackend, read_token, route_source
    from srtr.backends.agent.starters import HollowAgents, LocalAgents, SlurmAgents, Starter
    from srtr.backends.local import LocalBackend
    from srtr.backends.slurm import SlurmBackend

    token = None
    if adopt:
        try:
            token = read_token(run_dir)
        except OSError as exc:
            raise _bad(str(run_dir), f"no agent token to rejoin the agents with: {exc}") from None
    nodes = backend.nodes()
    starter: Starter
    if kind == "slurm":
        assert isinstance(backend, SlurmBackend)
        starter = SlurmAgents(backend.job_id, nodes, run_dir, backend.commands, adopt_window=window)
        host, steps = route_source(nodes[0].ip), backend
    elif hollow:  # one process simulates every node (docs/agents.md, "Hollow mode")
        starter, host, steps = HollowAgents(nodes, run_dir, adopt_window=window), "127.0.0.1", None
    else:
        node_tmp = backend.node_tmp if isinstance(backend, LocalBackend) else None
        starter = LocalAgents(nodes, run_dir, adopt_window=window, node_tmp=node_tmp)
        host, steps = "127.0.0.1", None
    return AgentBackend(
        nodes,
        starter,
        steps=steps,
        host=host,
        token=token,
        run_dir=run_dir,
        adopt=adopt,
        tls=cert.server_context(),
        fingerprint=cert.fingerprint,
        grown=grown,
    )


def _slurm_backend(
    args: argparse.Namespace, recipe: Any, count: int, run_dir: Path
) -> tuple[SlurmBackend, Started | None]:
    """Discover the allocation we run in, or get one with salloc (released at the end).

    For salloc the job's guard starts first, holding the memfd salloc's stderr goes to:
    from then on a kill -9 of srtr cannot leave the allocation behind, pending or granted
    (returned second; the job's lifecycle adopts it)."""
    from srtr.backends import slurm, slurm_alloc
    from srtr.runtime import guard

    commands = slurm.SlurmCommands()
    early = None
    try:
        if slurm.in_allocation():
            allocation = slurm.discover(commands)
        else:
            res = recipe.resources
            if shutil.which("salloc") is None:  # before the guard: nothing to clean up
                raise slurm.SlurmError(slurm_alloc.SALLOC_MISSING)
            print(f"srtr: asking SLURM for {count} node(s) (salloc)...", file=sys.stderr)
            output = os.memfd_create("srtr-salloc", os.MFD_CLOEXEC)
            early = guard.start_mirrored(run_dir, args.adopt_window, salloc_output=output)
            allocation = slurm.allocate(
                commands,
                nodes=count,
                job_name=f"srtr-{recipe.name}",
                partition=args.partition or res.partition,
                account=args.account or res.account,
                time_limit=args.time or res.time_limit,
                output=output,
            )
            os.close(output)
            print(
                f"srtr: got allocation {allocation.job_id}: "
                f"{', '.join(n.name for n in allocation.nodes)}",
                file=sys.stderr,
            )
    except slurm.SlurmError as exc:
        raise _bad("slurm", str(exc)) from None
    pyxis = slurm.pyxis_available(commands)
    return slurm.SlurmBackend(allocation, commands=commands, pyxis=pyxis), early


def _base_backend(
    args: argparse.Namespace, kind: str, recipe: Any, count: int, run_dir: Path
) -> tuple[Backend, SlurmBackend | None, Started | None]:
    """The local backend on `count` simulated nodes, or the SLURM backend (also returned
    second: it may own an allocation to release) and the guard started for its salloc."""
    if kind == "slurm":
        slurm_backend, early = _slurm_backend(args, recipe, count, run_dir)
        return slurm_backend, slurm_backend, early
    from srtr.backends.local import LocalBackend
    from srtr.backends.loopback import BLOCK_NODES, NetworkTaken, claim

    if count > BLOCK_NODES:
        raise _bad(
            "--nodes",
            f"must be at most {BLOCK_NODES} on the local backend (the addresses of a job's "
            f"loopback block); got {count}",
        )
    try:
        block = claim()  # addresses no other local job holds
    except NetworkTaken as exc:
        raise _bad("srtr up", str(exc)) from None
    return LocalBackend(count, block=block), None, None


def _isolate_nodes(backend: Backend, run_dir: Path, recipe: Path | str | None) -> None:
    """Simulated nodes get their own temp dirs under the run dir (local backend only). The
    recipe's directory stays the host's own on every node, as the run dir and the working
    directory do: it is the user's project dir, where the host adds files while the job runs
    (a node's overlaid /tmp may miss a file that appears after the node looked for it)."""
    from srtr.backends.local import LocalBackend

    if isinstance(backend, LocalBackend):
        shared = [Path(recipe).resolve().parent] if recipe and str(recipe) != "-" else []
        backend.isolate_nodes(run_dir / "nodes", shared=shared)


def _check_theme(name: str | None) -> None:
    """A bad `--theme` (or SRTR_THEME) for the TUI is an input error: exit 2."""
    try:
        from srtr.tui.themes import ThemeError, resolve
    except ImportError:
        return  # no TUI here: `up` shows progress lines, in no theme
    try:
        resolve(name)
    except ThemeError as exc:
        raise _bad("srtr up", str(exc)) from None


def cmd_up(args: argparse.Namespace) -> int:
    from srtr.backends.local import LocalBackend
    from srtr.cli.pins import decide_pins, write_pins
    from srtr.resources.effective import allocation_size
    from srtr.resources.loading import load_text, read_text
    from srtr.resources.planning import plan_text_source
    from srtr.runtime.lifecycle import JobOptions, run_job

    _startup_signals()
    if not args.headless and sys.stdout.isatty():
        _check_theme(args.theme)  # before anything starts, as for any bad flag
    adopt_from = _crashed_job(args)
    if adopt_from is not None:
        return _adopt(args, adopt_from)
    if args.recipe is None:
        raise _bad("srtr up", "give a RECIPE, or --adopt RUN_DIR")
    text = read_text(args.recipe)
    recipe = load_text(text, args.recipe)
    if args.nodes is not None and args.nodes < 1:
        raise _bad("--nodes", "must be at least 1")
    count = args.nodes or allocation_size(recipe)
    kind = _backend_kind(args)
    launcher = _launcher(args, kind)
    run_dir = _run_dir_path(args, recipe.name)
    # Before any allocation: a rev that does not resolve costs no queue time.
    pins = decide_pins(recipe, text, args.recipe, _submitted_pins(run_dir))
    backend, slurm_backend, early_guard = _base_backend(args, kind, recipe, count, run_dir)
    network = backend.block if isinstance(backend, LocalBackend) else None
    allocation = [(n.name, n.ip) for n in backend.nodes()]
    try:
        _, desired = plan_text_source(text, args.recipe, allocation, pins=pins)
        provisioner = _provisioner(kind, args, recipe, allocation, network)
        _create_run_dir(run_dir)
        write_pins(run_dir, pins)
        cert = _job_cert(run_dir)
        _isolate_nodes(backend, run_dir, args.recipe)
    except BaseException:
        if slurm_backend is not None:  # an allocation srtr made is released even so
            slurm_backend.release_allocation()
        if network is not None:
            network.release()
        raise
    prober = None
    if launcher == "agent":
        from srtr.backends.agent.backend import AgentProber

        base = backend
        backend = agent_backend = _agent_backend(
            kind, backend, run_dir, args.adopt_window, cert, hollow=args.hollow
        )
        prober = AgentProber(agent_backend)
        if kind == "slurm" and recipe.resources.grow != "never":
            provisioner = _slurm_provisioner(
                base, agent_backend, run_dir, args.adopt_window, cert.fingerprint
            )
    tui = not args.headless and sys.stdout.isatty()
    if tui:
        try:
            from srtr.tui.launch import run_with_tui
        except ImportError:
            print("srtr: the TUI is not available; showing progress lines", file=sys.stderr)
            tui = False
    options = JobOptions(
        progress=not tui,
        recipe=None if args.no_watch else Path(args.recipe),
        recipe_text=text,
        allocation=allocation,
        apply_auto=(args.apply or ("confirm" if tui else "auto")) == "auto",
        watch_poll=True if args.watch_poll else None,
        metrics_listen=args.metrics_port,
        slurm_job_id=slurm_backend.job_id if slurm_backend is not None else None,
        adopt_window=args.adopt_window,
        launcher=launcher,
        early_guard=early_guard,
        source_pins=pins,
        cert=cert,
        provisioner=provisioner,
        no_grow=_no_grow(kind, launcher, recipe.resources.grow),
        network=network,
    )
    with _held(network):
        if tui:
            return run_with_tui(
                run_dir, run_job(desired, run_dir, backend, options, prober), theme=args.theme
            )
        import asyncio

        return asyncio.run(run_job(desired, run_dir, backend, options, prober))


@contextlib.contextmanager
def _held(network: LoopbackBlock | None) -> Iterator[None]:
    """The job's loopback block is given back when the job ends (its guard lets go of its
    copy when it leaves)."""
    try:
        yield
    finally:
        if network is not None:
            network.release()


def _provisioner(
    kind: str,
    args: argparse.Namespace,
    recipe: Recipe,
    allocation: Sequence[tuple[str, str]],
    network: LoopbackBlock | None = None,
) -> Provisioner | None:
    """Where live edits get nodes past the allocation (`resources.grow: live-edit`): the
    local backend's simulated provider (hollow nodes too: the hollow process starts the new
    nodes' agents); none for `grow: never`."""
    if recipe.resources.grow == "never" or kind != "local":
        return None
    from srtr.backends.provision import LocalProvisioner

    try:
        return LocalProvisioner(len(allocation) + 1, block=network)
    except ValueError as exc:  # SRTR_LOCAL_PROVISION_DELAY is not a number of seconds
        raise _bad("SRTR_LOCAL_PROVISION_DELAY", str(exc)) from None


def _slurm_provisioner(
    base: Backend, agents: AgentBackend, run_dir: Path, window: float, fingerprint: str
) -> SlurmProvisioner:
    """Grow jobs next to the main job: their agents dial this controller (`admit`)."""
    from srtr.backends.agent.starters import RENDEZVOUS, TOKEN_FILE
    from srtr.backends.slurm import SlurmBackend
    from srtr.backends.slurm_provision import SlurmProvisioner

    assert isinstance(base, SlurmBackend)
    provisioner = SlurmProvisioner(
        base.commands,
        base.job_id,
        run_dir,
        fingerprint=fingerprint,
        adopt_window=window,
        files={"token": TOKEN_FILE, "rendezvous": RENDEZVOUS},
        admit=agents.admit,
    )
    agents.on_admitted = provisioner.poke
    return provisioner


def _no_grow(kind: str, launcher: str, grow: str) -> str:
    """Why a live edit cannot grow a pool past the allocation here, for its refusal."""
    if grow == "never":
        return "the recipe says resources.grow: never"
    if kind == "slurm" and launcher != "agent":
        return "growing past the allocation on SLURM needs the node agents (--launcher agent)"
    return ""


def _submitted_pins(run_dir: Path) -> dict[str, Pin]:
    """The pins `srtr submit` left in the run dir it made for this job (none once a job
    ran there: a new job in an old run dir pins afresh)."""
    from srtr.cli.pins import read_pins
    from srtr.reconciler.rundir import STATE_FILE

    return {} if (run_dir / STATE_FILE).exists() else read_pins(run_dir)


def _submit_plan(args: argparse.Namespace) -> tuple[Recipe, int, Path]:
    """The recipe to submit, its node count and its run dir (with the job's source pins);
    refuses what cannot fit and revs that do not resolve."""
    from srtr.cli.pins import decide_pins, write_pins
    from srtr.resources.effective import allocation_size
    from srtr.resources.expand import local_allocation
    from srtr.resources.loading import load_text, read_text
    from srtr.resources.planning import plan_text_source

    text = read_text(args.recipe)
    recipe = load_text(text, args.recipe)
    count = args.nodes or allocation_size(recipe)
    plan_text_source(text, args.recipe, local_allocation(count))  # refuse what cannot fit
    pins = decide_pins(recipe, text, args.recipe, {})
    run_dir = _make_run_dir(args, recipe.name).resolve()
    write_pins(run_dir, pins)
    return recipe, count, run_dir


def cmd_submit(args: argparse.Namespace) -> int:
    """Write a batch script that runs `srtr up --headless` and submit it with sbatch."""
    from srtr.backends import slurm, slurm_cmd

    recipe, count, run_dir = _submit_plan(args)
    path = run_dir / "submit.sh"
    path.write_text(_batch_script(args, recipe, count, run_dir), encoding="utf-8")
    try:
        # Once: sbatch is not idempotent, a retry after a timeout could submit twice.
        done = slurm.SlurmCommands(timeout=60.0).run(
            slurm_cmd.sbatch_argv(path), check=False, retry=False
        )
    except slurm.SlurmError as exc:  # not found, or timed out
        raise _bad("slurm", f"{exc}; the batch script is {path}: {_submit_hint(path)}") from None
    if done.returncode != 0:
        refused = done.stderr.strip() or f"exit {done.returncode}"
        raise _bad("sbatch", f"{refused}; the batch script is {path}: {_submit_hint(path)}")
    job_id = slurm_cmd.parse_sbatch_job_id(done.stdout)
    print(f"submitted job {job_id}; run dir {run_dir}")
    print(f"follow it with `srtr status {run_dir}` or `srtr tui {run_dir}`")
    return 0


def _submit_hint(path: Path) -> str:
    import shlex

    return f"submit it with `sbatch {shlex.quote(str(path))}` where SLURM is reachable"


def _batch_script(args: argparse.Namespace, recipe: Any, count: int, run_dir: Path) -> str:
    """The sbatch script: whole nodes, one of them running `srtr up --headless` in `run_dir`."""
    import shlex

    res = recipe.resources
    options = [
        f"--job-name=srtr-{recipe.name}",
        f"--nodes={count}",
        "--exclusive",
        "--no-kill",
        f"--output={run_dir / 'logs' / 'sbatch.out'}",
    ]
    for flag, value in (
        ("partition", args.partition or res.partition),
        ("account", args.account or res.account),
        ("time", args.time or res.time_limit),
    ):
        if value:
            options.append(f"--{flag}={value}")
    command = [
        sys.executable,
        "-m",
        "srtr",
        "up",
        str(Path(args.recipe).resolve()),
        "--headless",
        "--backend",
        "slurm",
        "--run-dir",
        str(run_dir),
    ]
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {o}\n" for o in options)
    return script + f"exec {shlex.join(command)}\n"


def _crashed_job(args: argparse.Namespace) -> RunState | None:
    """The state of a job whose controller died, when `up` is asked to take it over.

    `--adopt RUN_DIR` asks explicitly; `--run-dir DIR` of such a job implies it.
    """
    from srtr.cli.crash import killed_by_guard
    from srtr.reconciler.rundir import STATE_FILE

    where = args.adopt or args.run_dir
    if not where or not (Path(where) / STATE_FILE).exists():
        if args.adopt:
            raise _bad(args.adopt, "no state.json here; nothing to adopt")
        return None
    state = read_run(Path(where))
    if state.ended:
        if args.adopt:
            raise _bad(args.adopt, f"the job has ended ({state.phase}); nothing to adopt")
        return None
    killed = killed_by_guard(Path(where), state)
    if killed is not None:
        # Refused rather than relaunched: adoption takes over what still runs, with its
        # restart counts and passed stages; a job with nothing left is a new run, which
        # --reuse-run-dir starts cleanly (the old files kept aside).
        if args.adopt:
            raise _bad(
                args.adopt,
                f"{killed}; nothing to adopt. Start it again with "
                f"`srtr up RECIPE --run-dir {args.adopt} --reuse-run-dir`",
            )
        return None
    running = controller_running(Path(where))
    if running:
        raise _bad(str(where), f"belongs to a running job ({running})")
    return state


def _adopt(args: argparse.Namespace, state: RunState) -> int:
    from srtr.backends.base import NodeInfo
    from srtr.backends.local import LocalBackend
    from srtr.backends.provision import RequestState
    from srtr.cli.pins import read_pins
    from srtr.resources.loading import read_text
    from srtr.resources.objects import NodeMap
    from srtr.resources.planning import plan_text_source
    from srtr.runtime.lifecycle import JobOptions, run_job

    run_dir = Path(args.adopt or args.run_dir)
    job = state.job
    if job.get("backend") not in ("local", "slurm"):
        raise _bad(str(run_dir), f"cannot adopt a {job.get('backend')} job")
    applied = run_dir / "recipe.yaml"
    text = read_text(applied)
    allocation = [(n["name"], n["ip"]) for n in state.nodes]
    previous = NodeMap.from_json(state.doc["carve"], state.nodes)
    pins = read_pins(run_dir)  # the job's, never resolved again: its clones stay as they are
    # The run dir's copy is always recipe.yaml: a recipe without `name:` keeps its job's name.
    _, desired = plan_text_source(
        text, str(applied), allocation, previous, name=str(job.get("name") or "") or None, pins=pins
    )
    recipe_path = args.recipe or job.get("recipe_path")
    print(
        f"srtr: adopting the job in {run_dir} (its controller, pid {job.get('controller_pid')} "
        f"on {job.get('controller_host', '?')}, is gone)",
        file=sys.stderr,
    )
    backend: Backend
    slurm_job_id, network = None, None
    grow: Mapping[str, Any] = cast(Mapping[str, Any], state.doc.get("grow") or {})
    provisioned = [str(n) for n in grow.get("provisioned", [])]
    requests = [RequestState.from_json(r) for r in grow.get("requests", [])]
    if job["backend"] == "slurm":
        backend = _adopt_allocation(job, state.doc)
        slurm_job_id = backend.job_id
    else:
        grown = [NodeInfo(n, ip) for n, ip in allocation if n in set(provisioned)]
        network = _adopted_block(run_dir, job)
        backend = LocalBackend(len(allocation) - len(grown), grown, block=network)
    base = backend
    launcher = str(job.get("launcher") or "")
    _isolate_nodes(backend, run_dir, recipe_path)
    cert = _job_cert(run_dir, adopt=True)  # the one the agents pinned
    prober = None
    if launcher == "agent":
        from srtr.backends.agent.backend import AgentProber
        from srtr.backends.agent.starters import HOLLOW_CONTROL

        # A hollow job's agents are one process: losing a node must not kill all of them.
        hollow = job["backend"] == "local" and (run_dir / HOLLOW_CONTROL).exists()
        backend = agents = _agent_backend(
            job["backend"],
            backend,
            run_dir,
            args.adopt_window,
            cert,
            adopt=True,
            hollow=hollow,
            grown=provisioned,
        )
        prober = AgentProber(agents)
    provisioner = _adopted_provisioner(
        job, base, backend, run_dir, args, cert.fingerprint, allocation, requests, network
    )
    options = JobOptions(
        recipe=None if args.no_watch or not recipe_path else Path(recipe_path),
        recipe_text=text,
        allocation=allocation,
        apply_auto=(args.apply or "auto") == "auto",
        watch_poll=True if args.watch_poll else None,
        metrics_listen=args.metrics_port,
        adopt_from=dict(state.doc),
        adopt_window=args.adopt_window,
        slurm_job_id=slurm_job_id,
        launcher=launcher,
        source_pins=pins,
        cert=cert,
        provisioner=provisioner,
        provisioned=provisioned,
        network=network,
    )
    import asyncio

    with _held(network):
        return asyncio.run(run_job(desired, run_dir, backend, options, prober))


def _adopted_block(run_dir: Path, job: Mapping[str, Any]) -> LoopbackBlock:
    """The adopted job's loopback block, taken again: its instances run on its addresses."""
    from srtr.backends.loopback import NetworkTaken, block_of, reclaim

    try:
        return reclaim(block_of(cast(str | None, job.get("network"))))
    except (NetworkTaken, ValueError) as exc:
        raise _bad(str(run_dir), f"cannot adopt the job: {exc}") from None


def _adopted_provisioner(
    job: Mapping[str, Any],
    base: Backend,
    backend: Backend,
    run_dir: Path,
    args: argparse.Namespace,
    fingerprint: str,
    allocation: Sequence[tuple[str, str]],
    requests: Sequence[RequestState],
    network: LoopbackBlock | None = None,
) -> Provisioner | None:
    """The provider of the adopted job's grow requests, which follows them on (they were
    recorded in state.json) and gives their nodes back, as the crashed controller's did."""
    from srtr.backends.agent.backend import AgentBackend
    from srtr.backends.provision import LocalProvisioner

    if job["backend"] == "slurm":
        if not isinstance(backend, AgentBackend):
            return None  # --launcher step: grow jobs' nodes have no steps of the main job
        provisioner = _slurm_provisioner(base, backend, run_dir, args.adopt_window, fingerprint)
        provisioner.restore(requests)
        return provisioner
    numbers = [int(n[4:]) for n, _ in allocation if n.startswith("node") and n[4:].isdigit()]
    try:
        local = LocalProvisioner(max(numbers, default=len(allocation)) + 1, block=network)
    except ValueError as exc:
        raise _bad("SRTR_LOCAL_PROVISION_DELAY", str(exc)) from None
    local.restore(requests)
    return local


def _job_cert(run_dir: Path, *, adopt: bool = False) -> JobCert:
    """The job's TLS certificate: a new one, or (adopting) the crashed controller's, which
    its agents pinned; a run dir without one (made before TLS) gets a new one."""
    from srtr.backends import certs

    if adopt:
        try:
            return certs.for_job(run_dir, adopt=True)
        except (OSError, ValueError):
            pass
    return certs.for_job(run_dir)


def _adopt_allocation(job: Mapping[str, Any], state: Mapping[str, Any]) -> SlurmBackend:
    """The SLURM allocation of a crashed controller's job, if it still exists."""
    from srtr.backends import slurm, slurm_cmd
    from srtr.backends.base import NodeInfo

    job_id = str(job.get("slurm_job_id") or "")
    commands = slurm.SlurmCommands()
    alive = False
    if job_id:
        try:
            done = commands.run(slurm_cmd.squeue_state_argv(job_id), check=False)
        except slurm.SlurmError as exc:
            raise _bad("slurm", str(exc)) from None
        alive = done.returncode == 0 and slurm_cmd.parse_job_running(done.stdout)
    if not alive:
        raise _bad("slurm", f"allocation {job_id or '?'} of the job is gone; nothing to adopt")
    allocation = slurm.Allocation(
        job_id=job_id,
        nodes=[NodeInfo(n["name"], n["ip"]) for n in state["nodes"]],
        owned=bool(job.get("owns_allocation")),
    )
    return slurm.SlurmBackend(allocation, commands=commands, pyxis=slurm.pyxis_available(commands))
