"""Make a running job of a `JobRequest`: the one place that builds backend, agent wrapper,
prober, provisioner, certificate and `JobOptions`, for a new job and for an adopted one.

A new job plans on the backend's nodes (simulated ones, the allocation srtr runs in, or one
salloc gives), then creates its run dir; an adopted job plans its applied recipe on the
crashed controller's nodes, and its agents rejoin with the run dir's token and certificate.
Each kind of backend has its own branch, so every part that needs the concrete backend
(the SLURM job's steps, a simulated node's temp dir) gets it typed, without a downcast.

The result is the job's coroutine (`lifecycle.run_job`), for the CLI to run headless or
inside the TUI.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from srtr.backends.base import Backend, NodeInfo
from srtr.backends.local.backend import LocalBackend
from srtr.backends.local.loopback import (
    BLOCK_NODES,
    LoopbackBlock,
    NetworkTaken,
    block_of,
    claim,
    reclaim,
)
from srtr.backends.provision import LocalProvisioner, Provisioner, RequestState
from srtr.backends.slurm.backend import SlurmBackend
from srtr.net import certs
from srtr.resources.effective import allocation_size
from srtr.resources.loading import read_text
from srtr.resources.objects import DesiredState, NodeMap
from srtr.resources.pins import Pin, Pins
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Recipe
from srtr.runtime import slurm_jobs
from srtr.runtime.job_options import JobOptions
from srtr.runtime.pins import decide_pins, read_pins, write_pins
from srtr.runtime.request import JobRequest
from srtr.runtime.run_dir_setup import create_run_dir
from srtr.runtime.slurm_jobs import bad
from srtr.store.rundir import STATE_FILE, RunState

# The agents' modules (~0.1 s) are imported where a job has agents: most local jobs have none.
if TYPE_CHECKING:
    from srtr.backends.agent.backend import AgentBackend
    from srtr.backends.agent.starters import Starter
    from srtr.backends.slurm.provision import SlurmProvisioner
    from srtr.controllers.context import Prober as CtxProber

Job = Coroutine[Any, Any, int]
Allocation = list[tuple[str, str]]


def _run_job(
    desired: DesiredState,
    run_dir: Path,
    backend: Backend,
    options: JobOptions,
    prober: CtxProber | None,
) -> Job:
    """The job's coroutine (`lifecycle.run_job`). The controller's modules (~0.1 s) are
    imported here, once the job is planned: under `srtr up` on a terminal the plan is the
    TUI's first frame, and it leaves for the TUI before them."""
    from srtr.runtime.lifecycle import run_job

    return run_job(desired, run_dir, backend, options, prober)


@dataclass(frozen=True)
class _Wired:
    """What runs the instances (the backend itself, or agents on its nodes), who probes
    them there (None: here), and where live edits get more nodes (None: nowhere)."""

    backend: Backend
    prober: CtxProber | None
    provisioner: Provisioner | None


def new_job(request: JobRequest, text: str, recipe: Recipe) -> Job:
    """A new job of `recipe` (loaded from `text`, the file `request.recipe`); refuses a
    launcher the backend does not have, and source revs that do not resolve, before any
    node is allocated."""
    if request.recipe is None:
        raise bad("srtr up", "give a RECIPE, or --adopt RUN_DIR")
    kind = request.backend
    if kind == "auto":
        kind = "slurm" if slurm_jobs.in_allocation() else "local"
    launcher = _launcher(request, kind)
    # Before any allocation: a rev that does not resolve costs no queue time.
    pins = decide_pins(recipe, text, request.recipe, _submitted_pins(request.run_dir))
    source = _Source(request.recipe, text, pins, request.nodes or allocation_size(recipe))
    if kind == "slurm":
        return _new_on_slurm(request, source, recipe, launcher)
    return _new_local(request, source, recipe, launcher)


@dataclass(frozen=True)
class _Source:
    """A new job's recipe file, its text, its source pins and the nodes it gets."""

    path: str
    text: str
    pins: Pins
    count: int


def _launcher(request: JobRequest, kind: str) -> str:
    """The launcher the job runs with; refuses one the backend does not have."""
    native = "step" if kind == "slurm" else "process"
    if request.hollow:
        if kind != "local" or request.launcher not in ("auto", "agent"):
            raise bad("--hollow", "hollow agents simulate nodes of the local backend only")
        return "agent"
    default = "agent" if kind == "slurm" else native  # SLURM: one srun step for the agents
    launcher = default if request.launcher == "auto" else request.launcher
    if launcher not in (native, "agent"):
        raise bad("--launcher", f"the {kind} backend has no {launcher!r} launcher")
    return launcher


def _submitted_pins(run_dir: Path) -> dict[str, Pin]:
    """The pins `srtr submit` left in the run dir it made for this job (none once a job
    ran there: a new job in an old run dir pins afresh)."""
    return {} if (run_dir / STATE_FILE).exists() else read_pins(run_dir)


def _new_local(request: JobRequest, source: _Source, recipe: Recipe, launcher: str) -> Job:
    """On simulated nodes, at addresses of a loopback block no other local job holds; live
    edits grow onto more of them (`grow: live-edit`), hollow ones too: the hollow process
    starts the new nodes' agents."""
    block = _claim_block(source.count)
    try:
        local = LocalBackend(source.count, block=block)
        allocation = _allocation(local)
        desired = _plan(source, allocation, request, "local", None)
        grows = recipe.resources.grow != "never"
        provisioner = _local_provisioner(len(allocation) + 1, block) if grows else None
        cert = _new_run_dir(request.run_dir, source.pins)
        _isolate_nodes(local, request.run_dir, source.path)
        wired = _Wired(local, None, provisioner)
        if launcher == "agent":
            agents = _local_agents(local, request, cert, hollow=request.hollow)
            wired = _with_agents(agents, provisioner)
    except BaseException:
        block.release()
        raise
    options = _new_options(request, source, allocation, launcher, cert, wired)
    options = replace(options, no_grow="" if grows else _NEVER, network=block)
    return _holding(block, _run_job(desired, request.run_dir, wired.backend, options, wired.prober))


def _claim_block(count: int) -> LoopbackBlock:
    """Addresses no other local job holds (a lone job gets 127.0.0.x)."""
    if count > BLOCK_NODES:
        raise bad(
            "--nodes",
            f"must be at most {BLOCK_NODES} on the local backend (the addresses of a job's "
            f"loopback block); got {count}",
        )
    try:
        return claim()
    except NetworkTaken as exc:
        raise bad("srtr up", str(exc)) from None


async def _holding(block: LoopbackBlock, job: Job) -> int:
    """The job's loopback block is given back when the job ends (its guard lets go of its
    copy when it leaves)."""
    try:
        return await job
    finally:
        block.release()


def _adopted_block(run_dir: Path, job: Mapping[str, Any]) -> LoopbackBlock:
    """The adopted job's loopback block, taken again: its instances run on its addresses."""
    try:
        return reclaim(block_of(cast(str | None, job.get("network"))))
    except (NetworkTaken, ValueError) as exc:
        raise bad(str(run_dir), f"cannot adopt the job: {exc}") from None


def _new_on_slurm(request: JobRequest, source: _Source, recipe: Recipe, launcher: str) -> Job:
    """In the allocation srtr runs in, or one salloc gives (released if anything fails
    before the job runs); live edits grow through grow jobs, which need the agents."""
    flags = request.slurm.over(recipe.resources)
    slurm, early = slurm_jobs.allocation(
        recipe.name, source.count, flags, request.run_dir, request.adopt_window
    )
    allocation = _allocation(slurm)
    try:
        desired = _plan(source, allocation, request, "slurm", slurm.job_id)
        cert = _new_run_dir(request.run_dir, source.pins)
    except BaseException:  # an allocation srtr made is released even so
        slurm.release_allocation()
        raise
    grows = recipe.resources.grow != "never"
    wired = _Wired(slurm, None, None)
    if launcher == "agent":
        agents = _slurm_agents(slurm, request, cert)
        provisioner = _slurm_provisioner(slurm, agents, request, cert) if grows else None
        wired = _with_agents(agents, provisioner)
    no_grow = _NEVER if not grows else "" if launcher == "agent" else _NO_AGENTS
    options = _new_options(request, source, allocation, launcher, cert, wired)
    options = replace(options, no_grow=no_grow, slurm_job_id=slurm.job_id, early_guard=early)
    return _run_job(desired, request.run_dir, wired.backend, options, wired.prober)


# Why a live edit cannot grow a pool past the allocation, for its refusal.
_NEVER = "the recipe says resources.grow: never"
_NO_AGENTS = "growing past the allocation on SLURM needs the node agents (--launcher agent)"


def _allocation(backend: Backend) -> Allocation:
    return [(n.name, n.ip) for n in backend.nodes()]


def _plan(
    source: _Source, allocation: Allocation, request: JobRequest, backend: str, job_id: str | None
) -> DesiredState:
    """The job's plan; the request's watcher told as it begins and what it is."""
    watcher = request.plan_watcher
    if watcher is not None:
        watcher.planning()
    _, desired = plan_text_source(source.text, source.path, allocation, pins=source.pins)
    if watcher is not None:
        watcher.planned(desired, backend, job_id)
    return desired


def _new_run_dir(run_dir: Path, pins: Pins) -> certs.JobCert:
    """The new job's run dir, with its pins and a new certificate."""
    create_run_dir(run_dir)
    write_pins(run_dir, pins)
    return _job_cert(run_dir)


def _new_options(
    request: JobRequest,
    source: _Source,
    allocation: Allocation,
    launcher: str,
    cert: certs.JobCert,
    wired: _Wired,
) -> JobOptions:
    return JobOptions(
        progress=not request.tui,
        recipe=Path(source.path) if request.watch else None,
        recipe_text=source.text,
        allocation=allocation,
        apply_auto=request.apply_auto(),
        watch_poll=True if request.watch_poll else None,
        metrics_listen=request.metrics_listen,
        adopt_window=request.adopt_window,
        launcher=launcher,
        source_pins=source.pins,
        cert=cert,
        provisioner=wired.provisioner,
    )


def adopted_job(request: JobRequest, state: RunState) -> Job:
    """Take over the job of a crashed controller, whose state.json `state` is in
    `request.run_dir`: adopt what still runs, with its restart counts and passed stages."""
    run_dir, job = request.run_dir, state.job
    if job.get("backend") not in ("local", "slurm"):
        raise bad(str(run_dir), f"cannot adopt a {job.get('backend')} job")
    applied = run_dir / "recipe.yaml"
    text = read_text(applied)
    allocation = [(n["name"], n["ip"]) for n in state.nodes]
    previous = NodeMap.from_json(state.doc["carve"], state.nodes)
    pins = read_pins(run_dir)  # the job's, never resolved again: its clones stay as they are
    # The run dir's copy is always recipe.yaml: a recipe without `name:` keeps its job's name.
    name = str(job.get("name") or "") or None
    _, desired = plan_text_source(text, str(applied), allocation, previous, name=name, pins=pins)
    recipe_path = request.recipe or job.get("recipe_path")
    _say_adopting(run_dir, job)
    grown = _Grown.recorded(state)
    launcher = str(job.get("launcher") or "")
    slurm_job_id, network = None, None
    if job["backend"] == "slurm":
        slurm = slurm_jobs.adopted_allocation(job, state.doc)
        slurm_job_id = slurm.job_id
        cert = _job_cert(run_dir, adopt=True)  # the one the agents pinned
        wired = _adopt_on_slurm(slurm, request, cert, launcher, grown)
    else:
        nodes = [NodeInfo(n, ip) for n, ip in allocation if n in set(grown.provisioned)]
        network = _adopted_block(run_dir, job)
        local = LocalBackend(len(allocation) - len(nodes), nodes, block=network)
        _isolate_nodes(local, run_dir, recipe_path)
        cert = _job_cert(run_dir, adopt=True)
        wired = _adopt_local(local, request, cert, launcher, allocation, grown)
    options = JobOptions(
        recipe=None if not request.watch or not recipe_path else Path(recipe_path),
        recipe_text=text,
        allocation=allocation,
        apply_auto=request.apply_auto(),
        watch_poll=True if request.watch_poll else None,
        metrics_listen=request.metrics_listen,
        adopt_from=dict(state.doc),
        adopt_window=request.adopt_window,
        slurm_job_id=slurm_job_id,
        launcher=launcher,
        source_pins=pins,
        cert=cert,
        provisioner=wired.provisioner,
        provisioned=grown.provisioned,
        network=network,
    )
    job_run = _run_job(desired, run_dir, wired.backend, options, wired.prober)
    return job_run if network is None else _holding(network, job_run)


@dataclass(frozen=True)
class _Grown:
    """What the crashed controller recorded of growth: the nodes its grow requests gave
    (part of the allocation), and the requests, which the new provider follows on."""

    provisioned: list[str]
    requests: list[RequestState]

    @staticmethod
    def recorded(state: RunState) -> _Grown:
        grow: Mapping[str, Any] = cast(Mapping[str, Any], state.doc.get("grow") or {})
        return _Grown(
            [str(n) for n in grow.get("provisioned", [])],
            [RequestState.from_json(r) for r in grow.get("requests", [])],
        )


def _say_adopting(run_dir: Path, job: Mapping[str, Any]) -> None:
    print(
        f"srtr: adopting the job in {run_dir} (its controller, pid {job.get('controller_pid')} "
        f"on {job.get('controller_host', '?')}, is gone)",
        file=sys.stderr,
    )


def _adopt_on_slurm(
    slurm: SlurmBackend,
    request: JobRequest,
    cert: certs.JobCert,
    launcher: str,
    grown: _Grown,
) -> _Wired:
    """Steps only (--launcher step): grow jobs' nodes have no steps of the main job, so no
    provider. Agents: the grow requests recorded in state.json are followed on, and their
    nodes given back, as the crashed controller's provider did."""
    if launcher != "agent":
        return _Wired(slurm, None, None)
    agents = _slurm_agents(slurm, request, cert, adopt=True, grown=grown.provisioned)
    provisioner = _slurm_provisioner(slurm, agents, request, cert)
    provisioner.restore(grown.requests)
    return _with_agents(agents, provisioner)


def _adopt_local(
    local: LocalBackend,
    request: JobRequest,
    cert: certs.JobCert,
    launcher: str,
    allocation: Allocation,
    grown: _Grown,
) -> _Wired:
    """The simulated nodes' agents rejoin; the provider follows the recorded grow requests
    on, numbering new nodes after the highest one of `allocation`."""
    agents = None
    if launcher == "agent":
        from srtr.backends.agent.starters import HOLLOW_CONTROL

        # A hollow job's agents are one process: losing a node must not kill all of them.
        hollow = (request.run_dir / HOLLOW_CONTROL).exists()
        agents = _local_agents(
            local, request, cert, hollow=hollow, adopt=True, grown=grown.provisioned
        )
    numbers = [int(n[4:]) for n, _ in allocation if n.startswith("node") and n[4:].isdigit()]
    provisioner = _local_provisioner(max(numbers, default=len(allocation)) + 1, local.block)
    provisioner.restore(grown.requests)
    if agents is None:
        return _Wired(local, None, provisioner)
    return _with_agents(agents, provisioner)


def _local_agents(
    local: LocalBackend,
    request: JobRequest,
    cert: certs.JobCert,
    *,
    hollow: bool,
    adopt: bool = False,
    grown: Sequence[str] = (),
) -> AgentBackend:
    """A node agent per simulated node, or one process simulating them all (hollow)."""
    from srtr.backends.agent.starters import HollowAgents, LocalAgents

    token = _rejoin_token(request.run_dir) if adopt else None
    nodes, window = local.nodes(), request.adopt_window
    starter: Starter
    if hollow:  # one process simulates every node (docs/agents.md, "Hollow mode")
        starter = HollowAgents(nodes, request.run_dir, adopt_window=window)
    else:
        starter = LocalAgents(nodes, request.run_dir, adopt_window=window, node_tmp=local.node_tmp)
    return _agents(nodes, starter, "127.0.0.1", None, request.run_dir, cert, token, grown)


def _slurm_agents(
    slurm: SlurmBackend,
    request: JobRequest,
    cert: certs.JobCert,
    *,
    adopt: bool = False,
    grown: Sequence[str] = (),
) -> AgentBackend:
    """One srun step of node agents; SLURM keeps a step for the instances that need one."""
    from srtr.backends.agent.backend import route_source
    from srtr.backends.agent.starters import SlurmAgents

    token = _rejoin_token(request.run_dir) if adopt else None
    nodes = slurm.nodes()
    starter = SlurmAgents(
        slurm.job_id, nodes, request.run_dir, slurm.commands, adopt_window=request.adopt_window
    )
    host = route_source(nodes[0].ip)
    return _agents(nodes, starter, host, slurm, request.run_dir, cert, token, grown)


def _rejoin_token(run_dir: Path) -> str:
    """The crashed controller's agent token: its agents rejoin with it."""
    from srtr.backends.agent.backend import read_token

    try:
        return read_token(run_dir)
    except OSError as exc:
        raise bad(str(run_dir), f"no agent token to rejoin the agents with: {exc}") from None


def _agents(
    nodes: list[NodeInfo],
    starter: Starter,
    host: str,
    steps: Backend | None,
    run_dir: Path,
    cert: certs.JobCert,
    token: str | None,
    grown: Sequence[str],
) -> AgentBackend:
    """The agent backend: `token` set, the agents of the crashed controller rejoin."""
    from srtr.backends.agent.backend import AgentBackend

    return AgentBackend(
        nodes,
        starter,
        steps=steps,
        host=host,
        token=token,
        run_dir=run_dir,
        adopt=token is not None,
        tls=cert.server_context(),
        fingerprint=cert.fingerprint,
        grown=grown,
    )


def _with_agents(agents: AgentBackend, provisioner: Provisioner | None) -> _Wired:
    """The agents run the instances, and probe them on their nodes."""
    from srtr.backends.agent.backend import AgentProber

    return _Wired(agents, AgentProber(agents), provisioner)


def _local_provisioner(first: int, block: LoopbackBlock) -> LocalProvisioner:
    """The local backend's simulated provider, numbering new nodes from `first` in the
    job's loopback block."""
    try:
        return LocalProvisioner(first, block=block)
    except ValueError as exc:  # SRTR_LOCAL_PROVISION_DELAY is not a number of seconds
        raise bad("SRTR_LOCAL_PROVISION_DELAY", str(exc)) from None


def _slurm_provisioner(
    slurm: SlurmBackend, agents: AgentBackend, request: JobRequest, cert: certs.JobCert
) -> SlurmProvisioner:
    """Grow jobs next to the main job: their agents dial this controller (`admit`)."""
    from srtr.backends.agent.starters import RENDEZVOUS, TOKEN_FILE
    from srtr.backends.slurm.provision import SlurmProvisioner

    provisioner = SlurmProvisioner(
        slurm.commands,
        slurm.job_id,
        request.run_dir,
        fingerprint=cert.fingerprint,
        adopt_window=request.adopt_window,
        files={"token": TOKEN_FILE, "rendezvous": RENDEZVOUS},
        admit=agents.admit,
    )
    agents.on_admitted = provisioner.poke
    return provisioner


def _isolate_nodes(local: LocalBackend, run_dir: Path, recipe: Path | str | None) -> None:
    """Simulated nodes get their own temp dirs under the run dir. The recipe's directory
    stays the host's own on every node, as the run dir and the working directory do: it is
    the user's project dir, where the host adds files while the job runs (a node's overlaid
    /tmp may miss a file that appears after the node looked for it)."""
    shared = [Path(recipe).resolve().parent] if recipe and str(recipe) != "-" else []
    local.isolate_nodes(run_dir / "nodes", shared=shared)


def _job_cert(run_dir: Path, *, adopt: bool = False) -> certs.JobCert:
    """The job's TLS certificate: a new one, or (adopting) the crashed controller's, which
    its agents pinned; a run dir without one (made before TLS) gets a new one."""
    if adopt:
        try:
            return certs.for_job(run_dir, adopt=True)
        except (OSError, ValueError):
            pass
    return certs.for_job(run_dir)
