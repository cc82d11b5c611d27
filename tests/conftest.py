import sys
from pathlib import Path

# Test helpers (harness, workload) live next to the tests and are imported by name.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "chaos"))
