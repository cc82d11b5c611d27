"""Rules of the `source`, `build_command` and `srun_export_env` keys.

Field-level checks (empty argv, mutable refs, positive timeout) are in `recipe.py`; these
relate a key to the service's placement or to how srun is started.
"""

from __future__ import annotations

from srtr.resources.effective import effective_placement
from srtr.resources.errors import Path, Problem
from srtr.resources.recipe import Service

# Placements of exactly one node: the checkout is made once, on that node.
SINGLE_NODE_PLACEMENTS = ("head", "infra", "dedicated")
# Variables that steer the srun client itself (the SLURM backend's `steers_srun`): they
# cannot ride in its environment, so srtr would have to put them on the command line, which
# every user can read. srun_export_env promises the opposite, so they are refused.
_STEERING_PREFIXES = ("SLURM", "SRUN_", "SALLOC_", "SBATCH_", "PMI_", "PMIX_", "LD_", "GLIBC_")


def steers_srun(name: str) -> bool:
    return name == "PATH" or name.startswith(_STEERING_PREFIXES)


def check_keys(at: Path, service: Service) -> list[Problem]:
    problems = []
    # An owner's placement is its pool (`workers`), so even `nodes: 1` is refused, as srtctl.
    where = effective_placement(service)
    if service.source is not None and where not in SINGLE_NODE_PLACEMENTS:
        problems.append(
            Problem(
                (*at, "source"),
                f"requires a single-node placement (head or infra); got placement.node='{where}'",
            )
        )
    for key in service.srun_export_env:
        if steers_srun(key):
            problems.append(
                Problem(
                    (*at, "srun_export_env", key),
                    "would steer the srun client itself, so it cannot travel in srun's "
                    "--export; set it in env instead",
                )
            )
    return problems
