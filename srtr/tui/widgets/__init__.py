"""The TUI's widgets, one per module; each only renders what the App hands it."""
