"""DeepSpeed: `python -m trialkit.launch.deepspeed [[DEEPSPEED_OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)`.

Runs DeepSpeed's own launcher (the `deepspeed` command: deepspeed.launcher.runner)
with the topology from the environment, the overrides after trialkit's options
so that they win, and every worker under wrap_rank. On one node it needs no
hostfile (on a CPU build the workers use gloo); on several, each node runs its
own launcher over a generated hostfile with --no_ssh and its node rank, so no
ssh between containers is needed. Workers find their local rank in LOCAL_RANK
(the `--local_rank` argument would land in wrap_rank's arguments).
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import List, Optional, Sequence

from trialkit import env
from trialkit.launch import launcher

PROG = "trialkit.launch.deepspeed"
ENGINE = "deepspeed"
RANK_VARS = "RANK"


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    launch, topo = launcher.setup(PROG, ENGINE, argv)
    worker = launcher.wrapped(RANK_VARS, launch)
    if topo.num_nodes == 1:
        return launcher.supervise(PROG, ENGINE, launch, topo, build_command(topo, launch.overrides, worker))
    with tempfile.TemporaryDirectory(prefix="trialkit-deepspeed-") as tmp:
        hostfile = os.path.join(tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.write(hostfile_text(topo))
        command = build_command(topo, launch.overrides, worker, hostfile)
        return launcher.supervise(PROG, ENGINE, launch, topo, command)


if __name__ == "__main__":
    sys.exit(main())
