"""The App's keys that send intents: restart, stop, teardown, kill, Ctrl+C and quit. Each
asks first (`intents.py` says what), and goes over the job's control channel
(`srtr.runtime.control.send`) off the event loop. `SrtrApp` (app.py) is this App with its
screen, its reading and the rest of its keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import work
from textual.app import App

from srtr.runtime.control import ControlError, send
from srtr.tui import intents
from srtr.tui import viewmodel as vm
from srtr.tui.widgets.confirm import ConfirmModal
from srtr.tui.widgets.instances_table import InstancesTable


class IntentApp(App[int]):
    """The intent keys' half of the App (`SrtrApp` sets the state they read)."""

    run_dir: Path
    job: asyncio.Future[int] | None
    frame: vm.Frame | None
    _wake: asyncio.Event
    _teardown_sent: bool
    _quit_when_done: bool
    _job_code: int | None

    @property
    def job_running(self) -> bool:
        if self.job is not None:
            return not self.job.done()
        return self.frame is not None and not self.frame.ended

    def _selected(self) -> str | None:
        return self.query_one(InstancesTable).selected

    def action_restart(self) -> None:
        name = self._selected()
        if name is not None:
            self._confirm(intents.restart(name), name)

    def action_stop(self) -> None:
        name = self._selected()
        if name is not None:
            self._confirm(intents.stop(name), name)

    def action_teardown(self, ctrl_c: bool = False) -> None:
        self._confirm(intents.teardown(ctrl_c=ctrl_c, in_process=self.job is not None))

    def action_kill(self, ctrl_c: bool = False) -> None:
        self._confirm(intents.kill(ctrl_c=ctrl_c))

    def action_interrupt(self) -> None:
        screen = self.screen
        if isinstance(screen, ConfirmModal):
            if screen.ctrl_c_confirms:
                screen.dismiss(True)
            else:
                screen.dismiss(False)
            return
        if not self.job_running:
            self.exit(self._exit_code())
            return
        tearing = self._teardown_sent or (self.frame is not None and self.frame.tearing_down)
        if tearing:
            self.action_kill(ctrl_c=True)
        else:
            self.action_teardown(ctrl_c=True)

    async def action_quit(self) -> None:
        if self.job is not None and self.job_running:
            ask = intents.quit_in_process()

            def answered(yes: bool | None) -> None:
                if yes:
                    self._quit_when_done = True
                    self._send(ask.op, None)

            self.push_screen(ConfirmModal(ask.question, ask.detail), answered)
            return
        self.exit(self._exit_code())

    def _exit_code(self) -> int:
        return self._job_code if self._job_code is not None else 0

    def _confirm(self, ask: intents.Ask, instance: str | None = None) -> None:
        if not self.job_running:
            self.notify("the job has ended: nothing to do", severity="warning")
            return
        if isinstance(self.screen, ConfirmModal):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._send(ask.op, instance)

        modal = ConfirmModal(ask.question, ask.detail, ctrl_c_confirms=ask.ctrl_c)
        self.push_screen(modal, answered)

    @work(group="intents", exit_on_error=False)
    async def _send(self, op: str, instance: str | None) -> None:
        """Send one intent through the control socket, off the loop (it may serve it)."""
        if op in ("teardown", "interrupt", "kill"):
            self._teardown_sent = True
        try:
            message = await asyncio.to_thread(send, self.run_dir, op, instance)
        except ControlError as exc:
            self.notify(str(exc), title=f"{op} refused", severity="error")
        else:
            self.notify(message, title=op, timeout=3)
        self._wake.set()
