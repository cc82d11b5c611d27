"""What the App says around intents (pure, no Textual): which actions send one, what each
asks before it goes (`Ask`, the confirmation dialog's text), the help screen's note on what
quitting does, and the banner of a viewer that offers none."""

from __future__ import annotations

from dataclasses import dataclass

from srtr.tui import viewmodel as vm

# The keys that send intents to the job; none is offered once the job has ended.
INTENT_ACTIONS = frozenset({"restart", "stop", "teardown", "kill"})


@dataclass(frozen=True, slots=True)
class Ask:
    """A confirmation before intent `op` is sent; `ctrl_c`: a second Ctrl+C says yes."""

    question: str
    detail: str
    op: str
    ctrl_c: bool = False


def restart(name: str) -> Ask:
    return Ask(
        f"Restart {name}?", "SIGTERM now, SIGKILL after its grace, then it starts again.", "restart"
    )


def stop(name: str) -> Ask:
    return Ask(f"Stop {name}?", "It will not be restarted until the job ends.", "stop")


def teardown(*, ctrl_c: bool, in_process: bool) -> Ask:
    """`in_process`: the job runs in this TUI (`srtr up`), not in a viewer's."""
    return Ask(
        "Tear the job down?",
        "Tier by tier: SIGTERM, then SIGKILL after each instance's grace."
        + ("\nCtrl+C again: yes." if ctrl_c else "")
        + ("" if in_process else "\n(q quits this viewer and leaves the job running.)"),
        # Ctrl+C ends the job with 130 as it does headless; `T` is a SIGTERM-like 143.
        "interrupt" if ctrl_c else "teardown",
        ctrl_c=ctrl_c,
    )


def kill(*, ctrl_c: bool) -> Ask:
    return Ask(
        "Kill every instance now?",
        "SIGKILL to all, no grace." + ("\nCtrl+C again: yes." if ctrl_c else ""),
        "kill",
        ctrl_c=ctrl_c,
    )


def quit_in_process() -> Ask:
    """`q` in `srtr up`: the job ends with the TUI."""
    return Ask(
        "Tear the job down and quit?",
        "The job runs inside this TUI (srtr up): it ends with it.",
        "teardown",
    )


def help_note(*, job_running: bool, in_process: bool) -> str:
    """What the help screen says the intents and quitting do here."""
    if not job_running:
        return "Read-only: the job has ended; restart, stop and teardown are off."
    if in_process:
        return "The job runs in this TUI: quitting tears it down."
    return "Attached: quitting leaves the job running."


def read_only_banner(header: vm.HeaderView) -> str:
    """Why a viewer offers no intents: the job ended, or its controller is gone."""
    if header.controller_gone:
        return "the controller is not running: read-only (srtr up --adopt RUN_DIR) · q quits"
    return "the job has ended: read-only, no restart/stop/teardown · q quits"
