"""The job's runtime: what runs around the controllers while a job lives.

`assembly` makes a job of a `JobRequest` (`request`): backend, agents, prober, provider,
certificate. `lifecycle` starts and stops a job's side tasks in order (run dir files, control
socket, metrics, guard, recipe watcher, targets file) around the controller manager. Most
other modules are those side tasks, one each: I/O only, no decision on a timer (those are
keys). Only `srtr.cli` starts a job; the TUI imports `control` (to send intents) and nothing
else from here.
"""
