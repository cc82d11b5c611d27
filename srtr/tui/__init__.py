"""The Textual TUI of srtr: watch a job's pools and instances, read logs, send intents.

`launch.py` holds the two entry points the CLI calls (`run_with_tui` for `srtr up` on a
terminal, `attach` for `srtr tui RUN_DIR`); `app.py` the App, with its keys in `keys.py`,
what its intent keys ask in `intents.py` and what it does when the job of `srtr up` ends in
`job_end.py`; `terminal.py` the driver that survives a lost terminal; `source.py` reads the
run dir (through `srtr.store.rundir`) and `frames.py` builds frames from it in the
App's reading thread; `viewmodel/` decides what to show (pure, no Textual); `widgets/` has
one widget per file.
"""
