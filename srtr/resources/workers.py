"""Engine worker slots: where each worker of each role runs and which GPUs it sees.

Shared by the workers' own instances and by `placement.per: worker` services, so that a
per-worker service lands beside its worker with that worker's GPU view. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from srtr.resources.effective import roles
from srtr.resources.objects import NodeMap
from srtr.resources.recipe import Recipe

# Placeholders that exist only under `placement.per: worker`.
WORKER_KEYS = (
    "worker_role",
    "worker_index",
    "worker_node_rank",
    "worker_gpus",
    "worker_gpu_count",
)


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    role: str
    index: int  # the worker's index within its role
    node: str
    # srtr runs each worker as one process on one node, so its only node has rank 0; the
    # key exists so recipes written for srtctl's multi-node workers still render.
    node_rank: int
    gpus: tuple[int, ...]  # device indices on its node; empty when the role declares no GPUs

    def values(self) -> dict[str, str]:
        return {
            "worker_role": self.role,
            "worker_index": str(self.index),
            "worker_node_rank": str(self.node_rank),
            "worker_gpus": ",".join(str(g) for g in self.gpus),
            "worker_gpu_count": str(len(self.gpus)),
        }

    def gpu_view(self, gpus_per_node: int) -> str | None:
        """`CUDA_VISIBLE_DEVICES` for this worker's view, or None when it has the whole node.

        Only a worker using fewer GPUs than its node has is pinned.
        """
        if not self.gpus or len(self.gpus) >= gpus_per_node:
            return None
        return ",".join(str(g) for g in self.gpus)


def worker_slots(recipe: Recipe, nodes: NodeMap) -> list[WorkerSlot]:
    """Every worker of every role, in role then index order.

    Worker `i` of a role runs on node `i * nodes // workers` of the role; the workers sharing
    a node take consecutive blocks of `gpus` devices, in index order.
    """
    out = []
    for role_name, role in roles(recipe):
        members = nodes.role_nodes.get(role_name, ())
        if not members:
            continue
        workers = role.workers or role.nodes
        on_node: dict[str, int] = {}
        for index in range(workers):
            node = members[index * len(members) // workers]
            local = on_node.get(node, 0)
            on_node[node] = local + 1
            gpus = tuple(range(local * role.gpus, (local + 1) * role.gpus))
            out.append(WorkerSlot(role_name, index, node, 0, gpus))
    return out


def slots_for(
    slots: list[WorkerSlot], placement: str, members: list[str], node_order: tuple[str, ...]
) -> list[WorkerSlot]:
    """The workers a per-worker service with this placement attaches to.

    A role word picks that role's workers, `workers` picks every role's; sorted by (node
    order, worker index, node rank) as srtctl does.
    """
    chosen = set(members)
    position = {n: i for i, n in enumerate(node_order)}
    picked = [
        s for s in slots if s.node in chosen and (placement == "workers" or s.role == placement)
    ]
    return sorted(picked, key=lambda s: (position.get(s.node, len(position)), s.index, s.node_rank))
