"""The Textual TUI of srtr: watch a job's pools and instances, read logs, send intents.

`app.py` holds the App and the two entry points the CLI calls (`run_with_tui` for
`srtr up` on a terminal, `attach` for `srtr tui RUN_DIR`); `source.py` reads the run dir;
`viewmodel.py` decides what to show (pure, no Textual); `widgets/` has one widget per file.
"""
