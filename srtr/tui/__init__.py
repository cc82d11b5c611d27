"""The Textual TUI of srtr: watch a job's pools and instances, read logs, send intents.

`launch.py` holds the two entry points the CLI calls (`run_with_tui` for `srtr up` on a
terminal, `attach` for `srtr tui RUN_DIR`; `up_process.py` the two processes of `srtr up`,
`planned.py` the first frame from the plan); `app.py` the App, with its keys in `keys.py`,
its intent keys in `app_intents.py`, what they ask in `intents.py` and what it does when the
job of `srtr up` ends in `job_end.py`; `terminal.py` the driver that survives a lost
terminal; `source.py` reads the run dir (through `srtr.store.rundir`) and `frames.py` builds
frames from it in the App's reading thread; `viewmodel/` decides what to show (pure, no
Textual); `widgets/` has one widget per file.
"""
