"""What the Ray cluster holds, and where N workers of a given size go.

Placement is ours rather than Ray's: each worker is pinned to a node, so a
node with a spot notice can be left out, and rank 0 (which writes the
checkpoint) sits on the head, the one node that is never a spot instance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Dict, List, Sequence

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node alone
NAMESPACE = "trialkit"  # Ray's namespace for trialkit's named actors: trials', experiments' allocators


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    cpus: float
    gpus: float
    is_head: bool


def alive_nodes() -> List[Node]:
    import ray

    return [
        Node(n["NodeID"], n["NodeManagerAddress"], n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0),
             HEAD_RESOURCE in n["Resources"])
        for n in ray.nodes()
        if n.get("Alive")
    ]


def draining_nodes() -> Dict[str, float]:
    """Nodes Ray is draining (`ray start --block` got SIGTERM, KubeRay deletes the pod,
    the autoscaler preempts), each with its deadline (epoch seconds; 0: none)."""
    import ray
    import ray._private.state

    # Ray has no public call for this yet; Ray Data and Serve use this one.
    try:
        return {node: ms / 1000 for node, ms in ray._private.state.state.get_draining_nodes().items()}
    except (AttributeError, ray.exceptions.RayError):  # a Ray without it, or the GCS busy: none known now
        return {}


def slots(node: Node, cpus: float, gpus: float) -> int:
    """How many workers of `cpus` CPUs and `gpus` GPUs the node holds."""
    fits = [math.floor(have / need + 1e-9) for have, need in ((node.cpus, cpus), (node.gpus, gpus)) if need > 0]
    return min(fits) if fits else 1  # a worker that asks for nothing: one a node


def plan(nodes: Sequence[Node], cpus: float, gpus: float, max_workers: int,
         exclude: Collection[str] = ()) -> List[Node]:
    """The node of each rank: as many workers as fit, up to max_workers; the head
    first, then the other nodes in a stable order, each filled before the next."""
    usable = sorted((n for n in nodes if n.node_id not in exclude), key=lambda n: (not n.is_head, n.node_id))
    placed: List[Node] = []
    for node in usable:
        placed += [node] * slots(node, cpus, gpus)
    return placed[:max_workers]


def describe(nodes: Sequence[Node]) -> str:
    """'2 workers on 2 nodes (head, 3f2a91c0)' for the log."""
    names = []
    for node in nodes:
        name = "head" if node.is_head else node.node_id[:8]
        if name not in names:
            names.append(name)
    return f"{len(nodes)} worker{'s' * (len(nodes) != 1)} on {len(names)} node{'s' * (len(names) != 1)} " \
           f"({', '.join(names)})"
