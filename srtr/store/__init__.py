"""The store: typed status and its transitions (the only writer of status), and
the run dir contract (state.json, events.jsonl: the model, its reader and its writers)."""
