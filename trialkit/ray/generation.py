"""One generation of an elastic job: N replicas started under one restart count.

It places the replicas (each pinned to its node), starts them with the last
checkpoint, watches their nodes for spot notices, and at the end stops them
through their keepers, takes rank 0's checkpoint and removes the actors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Optional, Sequence

from trialkit.ray.cluster import Node
from trialkit import env
from trialkit.ray.replica import EXPERIMENT_ID, Checkpoint, Replica, ReplicaSpec
from trialkit.ray.trial_actor import RunResult

PLACE_TIMEOUT = 120.0  # for rank 0's actor to come up on its node (a fresh worker process)
CALL_TIMEOUT = 10.0  # for small calls to a live replica
STOP_MARGIN = 10.0  # beyond the grace: the keeper's flush, the runner's kill, the reply


def job_key(job_id: str) -> str:
    """The key the job's trainers use with the supervisor (their ADAPTDL_JOB_ID)."""
    return env.adaptdl_job_key(EXPERIMENT_ID, job_id)


@dataclass
class Member:
    rank: int
    node: Node
    actor: Any
    done: Any  # ObjectRef of the replica's RunResult


class Generation:
    def __init__(self, job: Any, nodes: Sequence[Node], restart: int, checkpoint: Optional[Checkpoint],
                 supervisor: Any = None):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.job_id = job.job_id
        actor_class = ray.remote(Replica)
        actors = [
            actor_class.options(num_cpus=job.cpus, num_gpus=job.gpus,
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
            .remote(f"rank {rank}")
            for rank, node in enumerate(nodes)
        ]
        port = ray.get(actors[0].free_port.remote(), timeout=PLACE_TIMEOUT)
        if supervisor is not None:
            # With a supervisor, AdaptDL's trainer asks it for rank 0's address (its discover call).
            supervisor.publish(job_key(job.job_id), restart, [node.address for node in nodes])
        shipped = ray.put(checkpoint)  # once, however many replicas read it
        self.members: List[Member] = []
        for rank, (node, actor) in enumerate(zip(nodes, actors)):
            spec = ReplicaSpec(job_id=job.job_id, command=job.command, rank=rank, replicas=len(nodes),
                               nodes=len({n.node_id for n in nodes}), restart=restart, master_addr=nodes[0].address,
                               master_port=port, grace=job.checkpoint_timeout, shared_dir=job.shared_dir,
                               checkpoint_every=job.checkpoint_every,
                               supervisor_url=supervisor.url if supervisor is not None else None)
            actor.start_replica.remote(spec, shipped)
            self.members.append(Member(rank, node, actor, actor.wait.remote()))
        # One watcher a node: a notice concerns the node, not a replica.
        watchers = {m.node.node_id: m for m in reversed(self.members)}
        self.notices: Dict[Any, Node] = {m.actor.watch_spot.remote(): m.node for m in watchers.values()}

    def member_of(self, done_ref: Any) -> Optional[Member]:
        return next((m for m in self.members if m.done == done_ref), None)

    def outcome(self, member: Member) -> Optional[RunResult]:
        """The replica's result, or None when its actor died (node lost, worker killed)."""
        import ray

        try:
            return ray.get(member.done)
        except ray.exceptions.RayActorError:
            return None

    def unresponsive(self, timeout: float) -> List[Member]:
        """Replicas whose actor does not answer within `timeout` (or is dead)."""
        import ray

        pings = {m.actor.ping.remote(): m for m in self.members}
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=timeout)
        lost = [pings[ref] for ref in pings if ref not in ready]
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                lost.append(pings[ref])
        return sorted(lost, key=lambda m: m.rank)

    def wait_all(self, timeout: float, members: Optional[List[Member]] = None) -> List[Optional[RunResult]]:
        import ray

        members = self.members if members is None else members
        ray.wait([m.done for m in members], num_returns=len(members), timeout=timeout)
        return [self.outcome(m) if _ready(m.done) else None for m in members]

    def stop(self, grace: float, lost_nodes: Collection[str] = ()) -> bool:
        """Ask every replica's keeper to stop (SIGTERM: AdaptDL saves and exits 143) and wait
        for them, force included, except those on `lost_nodes` (they cannot answer).
        True if rank 0 had to be killed when the grace ran out."""
        import ray

        reachable = [m for m in self.members if m.node.node_id not in lost_nodes]
        stops = {m.rank: m.actor.stop.remote(grace) for m in reachable if not _ready(m.done)}
        self.wait_all(grace + STOP_MARGIN, reachable)
        if 0 not in stops:
            return False
        try:
            return bool(ray.get(stops[0], timeout=CALL_TIMEOUT))
        except ray.exceptions.RayError:
            return True  # its runner is gone or stuck: it did not stop in time

    def take_checkpoint(self, timeout: float, lost_nodes: Collection[str] = ()) -> Optional[Checkpoint]:
        """Rank 0's checkpoint from this generation, if it wrote one (and its node is not lost)."""
        import ray

        if self.members[0].node.node_id in lost_nodes:
            return None
        try:
            return ray.get(self.members[0].actor.take_checkpoint.remote(), timeout=timeout)
        except ray.exceptions.RayError:
            return None

    def close(self, last: bool = False, lost_nodes: Collection[str] = ()) -> None:
        """Remove the replicas' homes (and, for the job's last generation, its dirs on
        each node), then the actors, which frees their resources."""
        import ray

        reachable = [m for m in self.members if m.node.node_id not in lost_nodes]
        calls = [m.actor.cleanup.remote() for m in reachable]
        if last:
            one_per_node = {m.node.node_id: m for m in reachable}.values()
            calls += [m.actor.remove_job_root.remote(self.job_id) for m in one_per_node]
        ray.wait(calls, num_returns=len(calls), timeout=CALL_TIMEOUT)
        for member in self.members:
            ray.kill(member.actor)


def _ready(ref: Any) -> bool:
    import ray

    return bool(ray.wait([ref], timeout=0)[0])
