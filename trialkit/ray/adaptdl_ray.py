"""adaptdl-ray: run an AdaptDL training script elastically on a Ray cluster.

    adaptdl-ray -u ray://HEAD:10001 -f code.py -m MAX_WORKERS --cpus C --gpus G
                [--working-dir DIR] [--checkpoint-timeout 120] [--cluster-rescale-timeout 60]
                [--shared-dir DIR] [--checkpoint-every SECONDS] [--experiment ID] -- SCRIPT_ARGS

Its life: read the arguments, find the script in the working dir, connect to
the cluster (shipping the working dir to it), start the controller actor on
the head node, wait for the job, and exit with the script's exit code. Inside
a trial, each sizing decision the controller makes also goes to the trial's
record (sdk.report_elastic): `trialkit trial show` and the page show it.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence, Tuple

from trialkit import env
from trialkit.errors import ArgumentParser, UserError, report_and_exit
from trialkit.ray import cluster, connect
from trialkit.ray.controller import Controller, Job, Outcome

PROG = "adaptdl-ray"
STOP_WAIT_MARGIN = 60.0  # after Ctrl-C: beyond the checkpoint timeout, for the controller to wind up
DECISION_WAIT = 30.0  # how long one call waits for the controller's next decision


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    options, script_args = argv[:split], argv[split + 1:]
    trial = env.read()
    parser = ArgumentParser(
        prog=PROG,
        usage=f"{PROG} -u ADDRESS -f SCRIPT -m MAX_WORKERS [options] [-- SCRIPT_ARGS...]",
        description="Run an AdaptDL training script on a Ray cluster, growing and shrinking with it: "
        "on a rescale, a lost node, a spot notice or a failed worker the job checkpoints and restarts "
        "on what the cluster holds.",
        epilog="Exit status: the script's; 2 for a usage error, an unreachable cluster or mismatched versions.",
    )
    parser.add_argument("-u", "--address", default=connect.AUTO,
                        help="the cluster: ray://HEAD:10001, HEAD:6379 or auto (default %(default)s)")
    parser.add_argument("-f", "--file", required=True,
                        help="the training script, relative to --working-dir when that is given")
    parser.add_argument("-m", "--max-workers", type=int, required=True,
                        help="the most workers the job may have; within it, AdaptDL's goodput model, fed by the "
                        "trainer's own hints, chooses how many pay (one until the first hints arrive)")
    parser.add_argument("--min-workers", type=int, default=1, metavar="N",
                        help="the fewest workers the job runs on (default %(default)s)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="a fixed number of workers: the goodput model is not asked (the job still "
                        "shrinks to what a smaller cluster holds, and grows back)")
    parser.add_argument("--cpus", type=float, default=1.0, help="CPUs per worker (default %(default)g)")
    parser.add_argument("--gpus", type=float, default=0.0, help="GPUs per worker (default %(default)g)")
    parser.add_argument("--working-dir", metavar="DIR",
                        help="shipped to every node: the script and the modules it imports "
                        "(default: the script's directory)")
    parser.add_argument("--checkpoint-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long rank 0 has to save a checkpoint when stopped; past it the previous "
                        "checkpoint is used (default %(default)g)")
    parser.add_argument("--cluster-rescale-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for new nodes when growing before scheduling on what "
                        "exists (default %(default)g)")
    parser.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                        default=trial.checkpoint_every,
                        help=f"seconds of training between checkpoints, so that a node that dies without "
                        f"warning costs at most that much; 0: checkpoint only when stopped (default "
                        f"${env.CHECKPOINT_EVERY}, else {env.DEFAULT_CHECKPOINT_EVERY:g})")
    parser.add_argument("--shared-dir", metavar="DIR",
                        help="a directory every node mounts (EFS, NFS): checkpoints and "
                        "ADAPTDL_SHARE_PATH live there instead of travelling through the controller")
    parser.add_argument("--experiment", metavar="ID",
                        default=None if trial.experiment_id == "standalone" else trial.experiment_id,
                        help="share the cluster with the other adaptdl-ray jobs given the same ID, by AdaptDL's "
                        "goodput policy (default: inside a trial, its experiment; outside one, the job plans alone)")
    opts = parser.parse_args(options)
    if opts.max_workers < 1:
        raise UserError(f"-m {opts.max_workers}: at least one worker is needed", "-m/--max-workers", "give 1 or more")
    for name, value in (("--min-workers", opts.min_workers), ("--workers", opts.workers)):
        if value is not None and not 1 <= value <= opts.max_workers:
            raise UserError(f"{name} {value} is outside 1..{opts.max_workers} (-m)", name,
                            f"give 1 to {opts.max_workers}, or raise -m")
    if opts.cpus < 0 or opts.gpus < 0 or not (opts.cpus or opts.gpus):
        raise UserError(f"--cpus {opts.cpus:g} --gpus {opts.gpus:g} is no worker size", "--cpus/--gpus",
                        "give each worker some CPUs or GPUs")
    for name in ("checkpoint_timeout", "cluster_rescale_timeout", "checkpoint_every"):
        if getattr(opts, name) < 0:
            raise UserError("must not be negative", "--" + name.replace("_", "-"), "give seconds >= 0")
    opts.script_args = script_args
    return opts


def locate_script(file: str, working_dir: Optional[str]) -> Tuple[Path, str]:
    """(the working dir, the script's path inside it); the script must be a file in it."""
    if working_dir is None:
        script = Path(file).resolve()
        if not script.is_file():
            raise UserError(f"{file} is not a file", "-f/--file", "give the path of the training script")
        return script.parent, script.name
    root = Path(working_dir).resolve()
    if not root.is_dir():
        raise UserError(f"{working_dir} is not a directory", "--working-dir",
                        "give the directory holding the script and its modules")
    script = (root / file).resolve()
    if not script.is_relative_to(root):
        raise UserError(f"{file} is not inside the working dir {root}", "-f/--file",
                        "give the script's path relative to --working-dir, inside it")
    if not script.is_file():
        raise UserError(f"{file} is not a file in the working dir {root}", "-f/--file",
                        "give the script's path relative to --working-dir")
    return root, str(script.relative_to(root))


def start_controller(job: Job):
    import ray

    # On the head (Ray's documented resource for it): the one node that is not
    # a spot instance and is not drained away. Threads for run(), stop(), next_decision()
    # and the experiment's allocator's wait_ended().
    return ray.remote(Controller).options(num_cpus=0, resources={cluster.HEAD_RESOURCE: 0.001},
                                          max_concurrency=4).remote(job)


def follow(controller, running, relay: bool) -> Outcome:
    """The job's outcome once run() returns; meanwhile, with `relay`, each sizing decision of the
    controller goes to the trial's record (sdk.report_elastic). One thread: Ray Client's
    connection belongs to the thread that made it."""
    import ray

    from trialkit import sdk

    seen, asked = 0, None
    while True:
        if relay and asked is None:
            asked = controller.next_decision.remote(seen, DECISION_WAIT)
        ready, _ = ray.wait([running] + [asked] * (asked is not None), num_returns=1)
        if running in ready:
            return ray.get(running)
        seen, decision, ended = ray.get(asked)
        asked = None
        relay = not ended
        if decision is not None:
            sdk.report_elastic(decision["workers"], decision["predicted"], decision["reason"])


def wait(controller, job: Job) -> Outcome:
    import ray

    running = controller.run.remote()
    try:
        try:
            return follow(controller, running, relay=bool(job.label))
        except KeyboardInterrupt:
            print(f"{PROG}: stopping: the workers get {job.checkpoint_timeout:g} s to checkpoint", file=sys.stderr)
            controller.stop.remote()
            return ray.get(running, timeout=job.checkpoint_timeout + STOP_WAIT_MARGIN)
    except ray.exceptions.ActorDiedError as err:  # its node or worker died; a bug in it shows its traceback
        return Outcome(1, f"the controller was lost: {str(err).strip().splitlines()[0]}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> int:
    # Ray folds lines that look alike across workers ("[repeated 2x across
    # cluster]"): every epoch line of every restart must reach the user.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        working_dir, script = locate_script(opts.file, opts.working_dir)
        address = connect.parse_address(opts.address, "-u/--address")
        connect.connect(address, "-u/--address", runtime_env=connect.runtime_env(str(working_dir)),
                        logging_level=logging.WARNING)
    except UserError as err:
        report_and_exit(PROG, err)
    # Set after Ray's own (which exits at once): a trial's keeper forwards SIGTERM when the
    # trial is stopped or its pod deleted, and the job then checkpoints and ends, as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    trial_id = env.read().trial_id
    job = Job(
        job_id=f"{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
        command=(script, *opts.script_args),
        max_workers=opts.max_workers,
        cpus=opts.cpus,
        gpus=opts.gpus,
        checkpoint_timeout=opts.checkpoint_timeout,
        rescale_timeout=opts.cluster_rescale_timeout,
        shared_dir=opts.shared_dir,
        checkpoint_every=opts.checkpoint_every,
        min_workers=opts.min_workers,
        fixed_workers=opts.workers,
        experiment_id=opts.experiment,
        label=trial_id if trial_id != "standalone" else "",
    )
    outcome = wait(start_controller(job), job)
    if outcome.error:
        print(f"{PROG}: {outcome.error}", file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
