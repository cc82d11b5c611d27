"""A service's setup steps: the `source` clone and the `build_command`.

Pure: this only describes the steps as SETUP instances that run before the service's own
stage (`<phase>/<name>.clone`, then `<phase>/<name>.build`). The instance controller
launches them through the backend like any instance; the job controller's stage gate
fails the job when one exits non-zero or outlives its timeout (see decisions.setup_gate).

The checkout lives in the run dir, `services/<name>/src`, written in the commands as
`"$SRTR_RUN_DIR"/services/<name>/src` (every instance gets SRTR_RUN_DIR), so the plan stays
independent of where the run dir is.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from srtr.resources.objects import DesiredState, InstanceKind, InstanceSpec, RestartSpec
from srtr.resources.recipe import Service

# srtctl's limits: each git command 600 s; the whole clone step 3*600+60 s.
GIT_TIMEOUT_SECONDS = 600
CLONE_TIMEOUT_SECONDS = 3 * GIT_TIMEOUT_SECONDS + 60
_GIT = f"timeout {GIT_TIMEOUT_SECONDS}s git -c http.version=HTTP/1.1"
# What a failed or timed-out step is called in the job's reason.
STEP_TEXT = {"clone": "source clone", "build": "build_command"}

ONCE = RestartSpec(
    policy="never",
    backoff_seconds=1.0,
    max_backoff_seconds=60.0,
    reset_after_seconds=600.0,
    max_restarts=0,
    window_seconds=1800.0,
)


def one_shot(first: InstanceSpec, **fields: Any) -> InstanceSpec:
    """`first` (an instance of the service) as a one-shot step of it: run once, with neither
    probe (its stage gate judges its exit), not critical, in no pool; `fields` set the rest."""
    return dataclasses.replace(
        first,
        kind=InstanceKind.SETUP,
        critical=False,
        terminal=False,
        restart=ONCE,
        probe=None,
        liveness=None,
        pool=None,
        replace_lost=False,
        deferred_probe=False,
        **fields,
    )


def checkout_dir(service: Service) -> str:
    return f'"$SRTR_RUN_DIR"/services/{service.name}/src'


def workdir(service: Service) -> str | None:
    """The shell word of the directory the build and the service run in (None: no source)."""
    source = service.source
    if source is None:
        return None
    sub = f"/{shlex.quote(source.path.strip('/'))}" if source.path else ""
    return checkout_dir(service) + sub


def clone_script(service: Service) -> str:
    """bash text: clone `source.git` and check out `source.rev`, unless already there.

    HTTP/1.1 because some proxies break git's HTTP/2 (srtctl does the same). A fetch of the
    rev, then `checkout FETCH_HEAD`, works for a tag, a full SHA and refs/pull/<n>/head.
    A pinned source fetches its commit (`source.pin`) instead, so a tag moved since the pin
    is not followed.
    """
    assert service.source is not None
    dest = checkout_dir(service)
    url, rev = shlex.quote(service.source.git), shlex.quote(service.source.rev)
    head = [
        "set -e",
        f"dest={dest}",
        'if [ -d "$dest/.git" ]; then echo "srtr: $dest is already checked out"; exit 0; fi',
        'mkdir -p "$(dirname "$dest")"',
        f'{_GIT} clone --filter=blob:none {url} "$dest"',
    ]
    pin = service.source.pin
    fetch = [f'{_GIT} -C "$dest" fetch origin {rev}'] if pin is None else _fetch_pin(service, pin)
    return "\n".join(
        [
            *head,
            *fetch,
            'git -C "$dest" -c advice.detachedHead=false checkout FETCH_HEAD',
            'echo "srtr: checked out $(git -C "$dest" rev-parse HEAD)"',
        ]
    )


def _fetch_pin(service: Service, pin: str) -> list[str]:
    """Fetch commit `pin`; where the server refuses a fetch by commit id, fetch the rev and
    accept it only if it still is `pin` (never build anything but the pin)."""
    assert service.source is not None
    rev = shlex.quote(service.source.rev)
    moved = f"services[{service.name}] source: %s is now %s, not the %s srtr pinned for this job"
    return [
        f"printf 'srtr: %s is pinned to %s\\n' {rev} {pin}",
        f'if ! {_GIT} -C "$dest" fetch origin {pin}; then',
        f"  printf 'srtr: the server refused a fetch of %s; fetching %s\\n' {pin} {rev}",
        f'  {_GIT} -C "$dest" fetch origin {rev}',
        "fi",
        'got=$(git -C "$dest" rev-parse "FETCH_HEAD^{commit}")',
        f'if [ "$got" != {pin} ]; then printf \'{moved}\\n\' {rev} "$got" {pin} >&2; exit 1; fi',
    ]


def setup_steps(service: Service, first: InstanceSpec, phase: str) -> list[InstanceSpec]:
    """The clone and build steps of `service`, on the node of its first instance `first`."""
    steps: list[InstanceSpec] = []
    base = one_shot(first, index=0)
    if service.source is not None:
        steps.append(
            dataclasses.replace(
                base,
                name=f"service_{service.name}.clone",
                type="clone",
                argv=(clone_script(service),),
                env=(("GIT_TERMINAL_PROMPT", "0"),),
                export_env=(),
                log=f"logs/service_{service.name}.clone.out",
                stage=f"{phase}/{service.name}.clone",
                preamble=None,
                shell=True,
                # the clone runs on the bare host, as srtctl's: no image, no srun extras
                container=None,
                cpus_per_task=None,
                cpu_bind=None,
                srun_options=(),
                run_timeout_seconds=float(CLONE_TIMEOUT_SECONDS),
            )
        )
    if service.build_command is not None:
        where = workdir(service)
        steps.append(
            dataclasses.replace(
                base,
                name=f"service_{service.name}.build",
                type="build",
                argv=tuple(service.build_command),  # not placeholder-rendered, as in srtctl
                log=f"logs/service_{service.name}.build.out",
                stage=f"{phase}/{service.name}.build",
                preamble=f"cd {where}" if where else None,
                shell=False,
                run_timeout_seconds=service.build_timeout_seconds,
            )
        )
    return steps


def live_edit_refusals(old: DesiredState, new: DesiredState) -> list[str]:
    """Why a live edit may not change a running service's clone or build.

    Its steps would run again as new stages while the service, whose preamble changed, is
    restarted at once: it could start before its build finished. A new service brings its
    steps along (their stages gate it); a removed one takes them away. A per-node `setup`
    is not one of them: it runs on each node the service gains (node_setup.py).
    """
    services_before = {s.service for s in old.instances if s.kind is not InstanceKind.SETUP}
    services_after = {s.service for s in new.instances if s.kind is not InstanceKind.SETUP}
    steps_before = {s.name: s.config_hash() for s in old.instances if _once(s)}
    steps_after = {s.name: s.config_hash() for s in new.instances if _once(s)}
    changed = sorted(
        {
            name.removeprefix("service_").rsplit(".", 1)[0]
            for name in steps_before.keys() | steps_after.keys()
            if steps_before.get(name) != steps_after.get(name)
        }
    )
    return [
        f"services[{service}].source/build_command cannot change while the service runs; "
        "change them in a new run"
        for service in changed
        if service in services_before and service in services_after
    ]


def _once(spec: InstanceSpec) -> bool:
    """A clone or a build: a step that runs once for the whole service."""
    return spec.kind is InstanceKind.SETUP and spec.type in STEP_TEXT
