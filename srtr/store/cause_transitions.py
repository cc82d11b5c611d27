"""The transition that remembers the job's first failure (`JobStatus.cause`).

Mixed into `Store`; `transitions.py` calls `failure` on every observed end of an attempt
and `note_failure` on those that are failures. Which ends are failures, and their class, is
`causes.classify`: here only what the store knows is added, that srtr itself caused the
end (a teardown, a stop it sent, a pool restart's hold), which is never a failure.
"""

from __future__ import annotations

from srtr.store import causes
from srtr.store.status import Cause, InstanceStatus
from srtr.store.store_base import StoreBase


class CauseTransitions(StoreBase):
    """The first failure of the job, mixed into `Store`."""

    def failure(
        self,
        status: InstanceStatus,
        *,
        exit_code: int | None,
        signal: int | None,
        reported: str = "",
        lost: bool = False,
    ) -> str | None:
        """The class of an attempt's end if it is a failure srtr did not cause, else None.

        Ends during a teardown are never failures; nor is the end of an attempt srtr sent a
        stop (a user's stop, a planned restart) or held for its pool's restart (a gang stop,
        or a member that ended on its own once its pool was restarting), unless what ended
        it was not that stop: a failed liveness probe's (`liveness_failed`, though srtr sent
        the signal), the kernel's OOM killer.
        """
        if self.job.teardown_requested:
            return None
        if status.liveness_failed and not lost:
            reported = reported or causes.LIVENESS_FAILED
        caused = status.stop_sent_at is not None or status.gang_held
        if caused and reported not in causes.ALWAYS_FAILURES:
            return None
        return causes.classify(exit_code, signal, reported=reported, lost=lost)

    def note_failure(
        self,
        name: str,
        reason: str,
        *,
        exit_code: int | None,
        signal: int | None,
        message: str,
    ) -> None:
        """`name`'s current attempt failed (`reason`): the job's cause, if it is the first."""
        self.touch(name)
        if self.job.cause is not None:
            return
        status, spec = self.status[name], self.specs[name]
        self.job.cause = Cause(
            instance=name,
            node=spec.node,
            attempt=status.attempt,
            at=self.clock.wall(),
            reason=reason,
            exit_code=exit_code,
            signal=signal,
            message=message,
            log=spec.log,
            log_offset=status.log_offset,
        )
