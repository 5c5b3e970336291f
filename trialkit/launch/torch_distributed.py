"""Distributed PyTorch: `python -m trialkit.launch.torch_distributed [[TORCHRUN_OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)`.

Runs torch.distributed.run (torchrun) with the topology from the environment
and no restarts (a failure is the trial's result), the overrides after
trialkit's options so that they win, and every worker under wrap_rank.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

from trialkit import env
from trialkit.launch import launcher

PROG = "trialkit.launch.torch_distributed"
ENGINE = "torchrun"
NEEDS = ("torch", "pip install torch==2.13.0")  # the CPU wheel, constraints.txt's pin (a test checks)
RANK_VARS = "RANK"


def build_command(topo: env.Topology, overrides: Sequence[str], worker: Sequence[str],
                  python: str = sys.executable) -> List[str]:
    """torchrun's argv; `worker` is what follows the worker's Python (`-m wrap_rank ...`)."""
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(topo.num_nodes),
        "--nproc_per_node", str(topo.slots_per_node),
        "--node_rank", str(topo.node_rank),
        "--master_addr", topo.chief_addr,
        "--master_port", str(topo.chief_port),
        "--max_restarts", "0",
        *overrides,
        *worker,
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    launch, topo = launcher.setup(PROG, ENGINE, argv, NEEDS)
    command = build_command(topo, launch.overrides, launcher.wrapped(RANK_VARS, launch))
    return launcher.supervise(PROG, ENGINE, launch, topo, command)


if __name__ == "__main__":
    sys.exit(main())
