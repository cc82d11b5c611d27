"""What every verb raises or exits with: bad input (exit 2) and a stop by signal."""

from __future__ import annotations

from srtr.resources.errors import Problem, RecipeError

EXIT_BAD_INPUT = 2
EXIT_PIPE_CLOSED = 128 + 13  # as a CLI killed by SIGPIPE: `srtr plan x.yaml | head`


class StoppedBySignal(BaseException):
    """SIGTERM or SIGHUP before the job's loop handles signals (salloc, planning)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.code = 128 + signum


def bad(where: str, message: str) -> RecipeError:
    """An input error of a verb: printed as `WHERE: message`, exit 2."""
    return RecipeError(where, [Problem((), message)])
