"""The job header: name, backend, phase, `gen 7/6` (desired/observed), elapsed, time left."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from srtr.store.status import JOB_ENDED
from srtr.tui.viewmodel.phases import JOB_PHASE_STYLE, Doc
from srtr.tui.viewmodel.text import fmt_age


@dataclass(frozen=True, slots=True)
class HeaderView:
    name: str
    backend: str
    slurm_job_id: str
    phase: str
    generation: str  # "gen 7/6": desired / observed
    elapsed: str
    time_left: str  # '' when not on SLURM; '?' when SLURM has not told us yet
    stage: str
    reason: str
    controller_gone: bool
    gate: str = ""  # `probe failing: gate fails in 42s (service_api)`: the nearest deadline
    cause_instance: str = ""  # the instance of the job's first failure (state.json job.cause)

    @property
    def phase_style(self) -> str:
        return JOB_PHASE_STYLE.get(self.phase, "")


def header(
    state: Doc,
    now: float,
    *,
    controller_alive: bool = True,
    gate_candidates: Iterable[Doc] | None = None,
) -> HeaderView:
    """`gate_candidates`: the instances whose probe may fail a stage gate, if the caller
    knows them (all of the state's otherwise: 80,000 looked at every second)."""
    candidates = state.get("instances", []) if gate_candidates is None else gate_candidates
    job = state.get("job", {})
    started = job.get("started_at")
    ended = job.get("ended_at")
    elapsed = "" if started is None else fmt_age((ended if ended is not None else now) - started)
    backend = str(job.get("backend", "?"))
    # `job.end_time` (wall seconds) is when the SLURM allocation ends, once known.
    end_time = job.get("end_time")
    if end_time is not None:
        time_left = fmt_age(end_time - now)
    else:
        time_left = "?" if backend == "slurm" else ""
    phase = str(job.get("phase", "?"))
    cause = job.get("cause")
    return HeaderView(
        name=str(job.get("name", "?")),
        backend=backend,
        slurm_job_id=str(job.get("slurm_job_id") or "—"),
        phase=phase,
        generation=f"gen {job.get('generation', '?')}/{job.get('observed_generation', '?')}",
        elapsed=elapsed,
        time_left=time_left,
        stage=stage_line(job),
        reason=str(job.get("reason") or ""),
        controller_gone=not controller_alive and phase not in JOB_ENDED,
        gate="" if phase in JOB_ENDED else gate_countdown(candidates, now),
        cause_instance=str(cause.get("instance") or "") if isinstance(cause, dict) else "",
    )


def stage_line(job: Doc) -> str:
    """`stage 2/3 workers` while stages launch, with what services with depends_on wait
    for (`· waiting: workers for scheduler ready`); `all 3 stages up` once every one passed."""
    stages = job.get("stages") or []
    stage_index = job.get("stage")
    if not stages or not isinstance(stage_index, int):
        return ""
    if set(stages) <= set(job.get("passed_stages") or ()):
        return f"all {len(stages)} stages up" if len(stages) > 1 else "the stage is up"
    shown = min(stage_index + 1, len(stages))
    current = stages[min(stage_index, len(stages) - 1)]
    line = f"stage {shown}/{len(stages)} {current}"
    waiting = job.get("waiting")
    if isinstance(waiting, dict) and waiting:
        line += " · waiting: " + "; ".join(f"{k} for {v}" for k, v in waiting.items())
    return line


def gate_countdown(instances: Iterable[Doc], now: float) -> str:
    """The failing probe nearest to failing its stage gate, and how long it has left."""
    nearest: Doc | None = None
    for inst in instances:
        if not inst.get("probe_gate") or not inst.get("probe_message"):
            continue
        deadline = inst.get("probe_deadline")
        if deadline is not None and (nearest is None or deadline < nearest["probe_deadline"]):
            nearest = inst
    if nearest is None:
        return ""
    left = fmt_age(max(0.0, float(nearest["probe_deadline"]) - now))
    return f"probe failing: gate fails in {left} ({nearest['name']})"
