"""Horovod: `python -m trialkit.launch.horovod [[HVD_OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)`.

Runs horovodrun (horovod.runner.launch) with every slot of every node in -H,
gloo (MPI when mpirun is present), the overrides after trialkit's options so
that they win, and every worker under wrap_rank. Horovod stops more cleanly on
SIGINT than on SIGTERM, so a failure stops the other workers with SIGINT.
horovodrun would decode and prefix the workers' output itself (and choke on
bytes that are not UTF-8): as under every launcher, wrap_rank writes to the
launcher's own stdout and stderr instead. On several nodes, horovodrun on node 0 starts every worker
over ssh: the launcher runs there only. On a Ray cluster, trialkit.ray.horovod
starts the workers without ssh.
"""
from __future__ import annotations

import shutil
import signal
import sys
from typing import List, Optional, Sequence

from trialkit import env
from trialkit.errors import UserError, report_and_exit
from trialkit.launch import launcher

PROG = "trialkit.launch.horovod"
ENGINE = "horovodrun"
NEEDS = ("horovod", "./bootstrap.sh test (tools/build_horovod.sh builds horovod 0.28.1 for this torch)")
RANK_VARS = "HOROVOD_RANK,RANK,OMPI_COMM_WORLD_RANK,PMI_RANK"
STOP_SIGNAL = signal.SIGINT  # horovod stops more cleanly on it than on SIGTERM


def build_command(topo: env.Topology, overrides: Sequence[str], worker: Sequence[str], mpi: bool = False,
                  python: str = sys.executable) -> List[str]:
    """horovodrun's argv; `worker` is what follows the worker's Python (`-m wrap_rank ...`)."""
    hosts = topo.hosts if topo.num_nodes > 1 else ("localhost",)
    return [
        python, "-m", "horovod.runner.launch",
        "-np", str(topo.world_size),
        "-H", ",".join(f"{host}:{topo.slots_per_node}" for host in hosts),
        "--mpi" if mpi else "--gloo",
        *overrides,
        python, *worker,
    ]


def check_topology(topo: env.Topology) -> None:
    if topo.num_nodes == 1:
        return
    if topo.node_rank != 0:
        raise UserError(f"this is node {topo.node_rank}: horovodrun on node 0 starts every worker over ssh",
                        f"topology from {topo.source}", "run the horovod launcher on node 0 only")
    if len(topo.hosts) != topo.num_nodes:
        raise UserError(f"{topo.num_nodes} nodes but {len(topo.hosts)} known addresses",
                        f"topology from {topo.source}", f"set {env.HOSTS} to every node's address")


def main(argv: Optional[Sequence[str]] = None) -> int:
    launch, topo = launcher.setup(PROG, ENGINE, argv, NEEDS)
    try:
        check_topology(topo)
    except UserError as err:
        report_and_exit(PROG, err)
    mpi = shutil.which("mpirun") is not None
    command = build_command(topo, launch.overrides, launcher.wrapped(RANK_VARS, launch), mpi)
    return launcher.supervise(PROG, ENGINE, launch, topo, command, stop_signal=STOP_SIGNAL)


if __name__ == "__main__":
    sys.exit(main())
