"""DeepSpeed: `python -m trialkit.launch.deepspeed [[DEEPSPEED_OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)`.

Runs DeepSpeed's own launcher (the `deepspeed` command: deepspeed.launcher.runner)
with the topology from the environment, the overrides after trialkit's options
so that they win, and every worker under wrap_rank. On one node it needs no
hostfile (on a CPU build the workers use gloo); on several, each node runs its
own launcher over a generated hostfile with --no_ssh and its node rank, so no
ssh between containers is needed. Workers find their local rank in LOCAL_RANK
(the `--local_rank` argument would land in wrap_rank's arguments). At the end it
removes the shared-memory segments DeepSpeed's CPU all-reduce leaves behind; a
cleaner of its own removes them too when the launcher is killed (the keeper's
SIGKILL at the end of its grace, which is also the launcher's).
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import List, Optional, Sequence

from trialkit import env
from trialkit.launch import launcher
from trialkit.process import when_gone

PROG = "trialkit.launch.deepspeed"
ENGINE = "deepspeed"
NEEDS = ("deepspeed", "pip install deepspeed==0.19.8 -c constraints.txt")  # constraints.txt's pin (a test checks)
RANK_VARS = "RANK"
SHM_DIR = "/dev/shm"


def build_command(topo: env.Topology, overrides: Sequence[str], worker: Sequence[str],
                  hostfile: Optional[str] = None, python: str = sys.executable) -> List[str]:
    """deepspeed's argv; `worker` is what follows the worker's Python (`-m wrap_rank ...`)."""
    nodes = ["--hostfile", hostfile, "--no_ssh", "--node_rank", str(topo.node_rank)] if hostfile else []
    return [
        python, "-m", "deepspeed.launcher.runner",
        *nodes,
        "--num_gpus", str(topo.slots_per_node),
        "--master_addr", topo.chief_addr,
        "--master_port", str(topo.chief_port),
        # The "script" is this Python, so that each worker runs wrap_rank.
        "--no_python", "--no_local_rank",
        *overrides,
        python, *worker,
    ]


def hostfile_text(topo: env.Topology) -> str:
    """DeepSpeed's hostfile: one line per node. With --no_ssh only the order
    and the slots matter, so unknown addresses get placeholder names."""
    hosts = topo.hosts or tuple(f"node-{i}" for i in range(topo.num_nodes))
    return "".join(f"{host} slots={topo.slots_per_node}\n" for host in hosts)


def remove_shm_segments(topo: env.Topology, shm_dir: str = SHM_DIR) -> None:
    """Unlink what DeepSpeed's CPU all-reduce left in /dev/shm for this launch.

    Each worker maps a segment of tens of MB there, named after the job's master
    address and port and its rank, and never unlinks it: memory that would
    outlive every trial run on the node (69 MB a rank with DeepSpeed 0.19).
    """
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{topo.chief_addr}_{topo.chief_port}_"
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass  # gone already, or not ours to remove


def main(argv: Optional[Sequence[str]] = None) -> int:
    launch, topo = launcher.setup(PROG, ENGINE, argv, NEEDS)
    worker = launcher.wrapped(RANK_VARS, launch)
    when_gone(lambda: remove_shm_segments(topo))
    try:
        if topo.num_nodes == 1:
            return launcher.supervise(PROG, ENGINE, launch, topo, build_command(topo, launch.overrides, worker))
        with tempfile.TemporaryDirectory(prefix="trialkit-deepspeed-") as tmp:
            hostfile = os.path.join(tmp, "hostfile")
            with open(hostfile, "w") as f:
                f.write(hostfile_text(topo))
            command = build_command(topo, launch.overrides, worker, hostfile)
            return launcher.supervise(PROG, ENGINE, launch, topo, command)
    finally:
        remove_shm_segments(topo)


if __name__ == "__main__":
    sys.exit(main())
