"""One AdaptDL replica on a Ray node: the trial runner plus AdaptDL's layout.

Each replica is a keeper running the user's script with AdaptDL's environment
(rank, replicas, master address and port, restart count, checkpoint and share
paths). Without shared storage the checkpoint travels: the controller hands
every replica the job's last checkpoint as a tar, unpacked into the replica's
own checkpoint dir, and rank 0 packs the one it wrote when it was stopped.
With a shared dir every replica reads there and rank 0 writes there; nothing
travels. The spot watcher runs here too: it has to poll from the node itself.
"""
from __future__ import annotations

import asyncio
import io
import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from trialkit import adaptdl, env
from trialkit.launch.ports import rendezvous_port
from trialkit.ray import spot
from trialkit.ray.trial_actor import TrialRunner

EXPERIMENT_ID = "adaptdl-ray"


@dataclass(frozen=True)
class ReplicaSpec:
    job_id: str
    command: Tuple[str, ...]  # the script and its arguments, run with the node's python
    rank: int
    replicas: int
    nodes: int
    restart: int
    master_addr: str
    master_port: int
    grace: float  # the checkpoint timeout: how long the script has to save once stopped
    shared_dir: Optional[str]  # storage every node mounts; None: checkpoints travel as tars
    checkpoint_every: float  # seconds of training between checkpoints; 0: on a stop only
    supervisor_url: Optional[str] = None  # the controller's supervisor: hints go there, peers are found there


@dataclass(frozen=True)
class Checkpoint:
    restart: int  # the restart count it was written under
    data: Optional[bytes]  # a tar of checkpoint-<restart>; None when it lives in the shared dir
    step: Optional[int] = None  # the training step it was taken at, if trialkit's hook wrote it

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        return f"the checkpoint of restart {self.restart}{at}"


def supervisor_environ(url: Optional[str]) -> Dict[str, str]:
    """What makes AdaptDL's trainer report its hints to `url` (and find its peers there). It
    checks the scheduler's major version against its own: the protocol is adaptdl 0.2's."""
    if not url:
        return {}
    from importlib.metadata import version

    return {env.ADAPTDL["supervisor_url"]: url, env.ADAPTDL["sched_version"]: version("adaptdl")}


def job_root(job_id: str) -> Path:
    """This node's directory for the job (share dir, replicas' homes)."""
    return Path(tempfile.gettempdir()) / "trialkit-adaptdl" / job_id


def _pack(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(directory, arcname=directory.name)
    return buffer.getvalue()


def _unpack(data: bytes, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(into, filter="data")


class Replica(TrialRunner):
    def __init__(self, label: str):
        super().__init__(label)
        self._spec: Optional[ReplicaSpec] = None
        self._home: Optional[Path] = None
        self._checkpoints: Optional[Path] = None

    async def free_port(self) -> int:
        """A port free on this node now, for rank 0 to listen on."""
        return rendezvous_port()

    async def start_replica(self, spec: ReplicaSpec, checkpoint: Optional[Checkpoint]) -> int:
        self._spec = spec
        root = job_root(spec.job_id)
        self._home = root / f"restart-{spec.restart}-rank-{spec.rank}"
        shared = Path(spec.shared_dir) if spec.shared_dir else None
        self._checkpoints = shared / "checkpoint" if shared else self._home / "checkpoint"
        if checkpoint is not None and checkpoint.data is not None:
            await asyncio.to_thread(_unpack, checkpoint.data, self._checkpoints)
        return await self.start([sys.executable, *spec.command], self._environ(spec, shared or root))

    def _environ(self, spec: ReplicaSpec, share_parent: Path) -> Dict[str, str]:
        cwd = str(Path.cwd())  # the job's working dir, unpacked here by Ray
        return {
            env.EXPERIMENT_ID: EXPERIMENT_ID,
            env.TRIAL_ID: spec.job_id,
            env.PLATFORM: "ray",
            env.TRIAL_DIR: str(self._home),
            env.CHECKPOINT_DIR: str(self._checkpoints),
            env.SHARE_DIR: str(share_parent / "share"),
            env.RESTART_COUNT: str(spec.restart),
            env.GRACE_SECONDS: str(spec.grace),
            env.CHECKPOINT_EVERY: f"{spec.checkpoint_every:g}",
            env.CODE_DIR: cwd,
            # Modules beside the script, and at the working dir's top, import as they do locally.
            "PYTHONPATH": os.pathsep.join(filter(None, [cwd, os.environ.get("PYTHONPATH")])),
            env.ADAPTDL["replica_rank"]: str(spec.rank),
            env.ADAPTDL["num_replicas"]: str(spec.replicas),
            env.ADAPTDL["num_nodes"]: str(spec.nodes),
            env.ADAPTDL["master_addr"]: spec.master_addr,
            env.ADAPTDL["master_port"]: str(spec.master_port),
            **supervisor_environ(spec.supervisor_url),
        }

    async def take_checkpoint(self) -> Optional[Checkpoint]:
        """The newest checkpoint this replica (rank 0) committed under the current restart count:
        on a stop, or the last periodic one when the stop came too late or a peer was lost."""
        spec, directory = self._spec, self._checkpoints
        if spec is None or directory is None:
            return None
        written = directory / adaptdl.checkpoint_name(spec.restart)
        if not written.is_dir():
            return None
        data = None if spec.shared_dir else await asyncio.to_thread(_pack, written)
        return Checkpoint(spec.restart, data, adaptdl.checkpoint_step(written))

    async def cleanup(self) -> None:
        """Remove this replica's home; in a shared dir, a half-written checkpoint too."""
        if self._home is not None:
            await asyncio.to_thread(shutil.rmtree, self._home, True)
        if self._spec is not None and self._spec.shared_dir and self._spec.rank == 0 and self._checkpoints:
            await asyncio.to_thread(shutil.rmtree, self._checkpoints / adaptdl.STAGING, True)

    async def remove_job_root(self, job_id: str) -> None:
        """At the job's end: this node's share dir and whatever else the job left here."""
        await asyncio.to_thread(shutil.rmtree, job_root(job_id), True)

    async def watch_spot(self) -> Optional[Dict[str, str]]:
        """Returns this node's spot notice when one is posted; None if the node is not on EC2."""
        watcher = spot.SpotWatcher(spot.node_url())
        while True:
            try:
                notice = await asyncio.to_thread(watcher.check)
            except spot.Unreachable:
                return None
            if notice is not None:
                return notice
            await asyncio.sleep(spot.POLL_SECONDS)
