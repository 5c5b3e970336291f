"""Horovod on a Ray cluster, no ssh:

    python -m trialkit.ray.horovod [[RAY_OPTIONS...] --] (--trial TRIAL)|(SCRIPT...)

The launchers' command line (trialkit.launch.grammar); the overrides are the
options below, for Ray's placement instead of an engine's.

Ray starts the workers and Horovod's own gloo rendezvous connects them, as
horovodrun does over ssh: place --nodes bundles of --workers-per-node workers
on distinct nodes (a STRICT_SPREAD placement group), one RankWorker actor per
worker (trialkit.ray.rank_worker), ask each where it runs, assign the ranks
with Horovod's host assignment, serve Horovod's rendezvous from this process
on its node's address, and start every worker as `python -m wrap_rank ...`
with the variables horovodrun gives a gloo worker. Then supervise: relay each
worker's rank-prefixed lines to our stdout and stderr, stop every worker
when one fails (SIGINT) or a stop signal reaches us (that signal), SIGKILL
what is left after the grace, and exit with the first failure's code.

Why not horovod.ray's RayExecutor: it runs on Ray 2.60, but it runs Python
functions inside synchronous actors, so a running worker takes no signal
(only ray.kill, without a grace); its rendezvous binds every interface; and
the workers' output reaches the driver through Ray's log forwarding, which
prefixes and deduplicates lines. docs/launchers.md says more.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit import env
from trialkit import trial as trials
from trialkit.errors import UserError, report_and_exit
from trialkit.launch import grammar, horovod, launcher
from trialkit.launch.supervisor import announce, failed_verdict, stopped_verdict
from trialkit.launch.wrap_rank import _writev_all  # the same whole-line writes as every rank's prefixer
from trialkit.process import FORWARDED_SIGNALS, STOP_SIGNALS
from trialkit.ray import connect

PROG = "trialkit.ray.horovod"
ENGINE = "ray"
TICK = 0.2  # Ray futures have no fd to select on: how often the loop looks at signals and the grace
RAY_ONLY = ("RAY_", )  # a Ray process's own variables (job id, raylet pid): each worker keeps its node's
NODE_ONLY = ("CUDA_VISIBLE_DEVICES", env.LAUNCH_SOCKET, "PWD")


@dataclass(frozen=True)
class Options:
    nodes: int = 1
    workers_per_node: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    address: str = "auto"
    placement_timeout: float = 60.0
    working_dir: Optional[str] = None  # shipped to every worker by Ray; else they run in our working directory

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UserError(message, fix="the options: " + self.options())

    def options(self) -> str:
        return self.format_usage().split(" ", 2)[-1].strip()  # the usage line without "usage: PROG"


def parse_options(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    """The overrides (before --); the address defaults to $RAY_ADDRESS, else auto."""
    return Options(**vars(_parser(environ).parse_args(list(argv))))


def _parser(environ: Mapping[str, str]) -> _Parser:
    parser = _Parser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--nodes", type=_positive(int), default=1)
    parser.add_argument("--workers-per-node", type=_positive(int), default=1)
    parser.add_argument("--cpus-per-worker", type=_positive(float, zero=True), default=1.0)
    parser.add_argument("--gpus-per-worker", type=_positive(float, zero=True), default=0.0)
    parser.add_argument("--address", default=environ.get("RAY_ADDRESS") or "auto")
    parser.add_argument("--placement-timeout", type=_positive(float), default=60.0)
    parser.add_argument("--working-dir", type=_directory)
    return parser


def _positive(kind, zero: bool = False):
    def convert(text: str):
        value = kind(text)
        if value < 0 or (value == 0 and not zero):
            raise ValueError(text)
        return value
    convert.__name__ = f"{'non-negative' if zero else 'positive'} {kind.__name__}"
    return convert


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return os.path.abspath(text)


def bundles(options: Options) -> List[Dict[str, float]]:
    """One placement-group bundle per node: what its workers hold together."""
    bundle = {"CPU": options.cpus_per_worker * options.workers_per_node}
    if options.gpus_per_worker:
        bundle["GPU"] = options.gpus_per_worker * options.workers_per_node
    return [dict(bundle) for _ in range(options.nodes)]


def assignments(node_ids: Sequence[str]) -> list:
    """Horovod's slots (rank, local and cross ranks) for the workers' nodes, listed bundle by bundle."""
    from collections import Counter

    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    counts = Counter(node_ids)  # in bundle order
    return get_host_assignments([HostInfo(node, n) for node, n in counts.items()], len(node_ids))


def worker_environ(base: Mapping[str, str], slot, rendezvous: Tuple[str, int], iface: Optional[str],
                   gpus: float) -> Dict[str, str]:
    """A worker's variables over its node's own: ours (as horovodrun passes its environment on),
    minus what belongs to the node, plus what horovodrun sets for a gloo worker."""
    from horovod.runner.gloo_run import create_slot_env_vars

    out = {k: v for k, v in base.items() if not k.startswith(RAY_ONLY) and k not in NODE_ONLY}
    out.update(create_slot_env_vars(slot))
    out.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous[0],
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous[1]),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    })
    if iface:
        out["HOROVOD_GLOO_IFACE"] = iface
    if not gpus:
        out["CUDA_VISIBLE_DEVICES"] = ""  # Ray leaves a GPU-less actor the node's GPUs
    return out


# -- the story ------------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if grammar.wants_help(argv):
        print(grammar.usage(PROG, ENGINE))
        print("RAY_OVERRIDES: " + _parser(os.environ).options())
        raise SystemExit(0)
    try:
        launch = grammar.parse(argv, ENGINE)
        if launch.trial:
            trials.check_spec(launch.trial)
        options = parse_options(launch.overrides, os.environ)
        check_installed()
        join(options)
    except UserError as err:
        report_and_exit(PROG, err)
    import ray

    job = Job(PROG, launch.describe(), env.read().grace_seconds, horovod.STOP_SIGNAL)
    try:
        try:
            job.place(options)
        except UserError as err:
            print(f"{PROG}: {err.line()}", file=sys.stderr, flush=True)
            return 1
        job.start([sys.executable, *launcher.wrapped(horovod.RANK_VARS, launch)], options)
        return job.supervise()
    finally:
        # Ray ends a job's actors and placement group with it: nothing outlives the launcher.
        ray.shutdown()


def check_installed() -> None:
    for module, how in (("ray", "pip install trialkit[ray]"), ("horovod", "tools/build_horovod.sh")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"{module} is not installed here",
                            fix=f"install it with {how} on the launcher's node and the workers'") from None


def join(options: Options) -> None:
    """Join the cluster as a driver; Ray ships --working-dir to every worker as their working dir."""
    # Our stdout is the workers' lines only: Ray's own forwarding of them is off.
    connect.connect(connect.parse_address(options.address, "--address"), "--address",
                    runtime_env=connect.runtime_env(options.working_dir), log_to_driver=False,
                    logging_level="WARNING")


@dataclass
class Worker:
    rank: int
    actor: object
    exit_code: Optional[int] = None
    lost: str = ""  # why its actor is gone, when it died before its exit code came
    asked_to_stop: bool = False

    @property
    def running(self) -> bool:
        return self.exit_code is None and not self.lost

    def describe(self) -> str:
        return f"its Ray worker lost ({self.lost})" if self.lost else f"exit code {self.exit_code}"


@dataclass
class Job:
    prog: str
    script: str
    grace: float
    stop_signal: int
    workers: List[Worker] = field(default_factory=list)
    failed: Optional[Worker] = None
    stopped_by: Optional[int] = None
    kill_at: Optional[float] = None

    def place(self, options: Options) -> None:
        """The placement group, one bundle per distinct node, and one actor per worker in it."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trialkit.ray.rank_worker import RankWorker

        group = placement_group(bundles(options), strategy="STRICT_SPREAD")
        ready, _ = ray.wait([group.ready()], timeout=options.placement_timeout)
        if not ready:
            raise UserError(f"the cluster has no room for {options.nodes} x {bundles(options)[0]} on distinct nodes "
                            f"after {options.placement_timeout:g} s", "--nodes",
                            "use fewer nodes or smaller workers, or add nodes")
        remote = ray.remote(RankWorker)
        for rank in range(options.world_size):
            strategy = PlacementGroupSchedulingStrategy(group, rank // options.workers_per_node)
            actor = remote.options(num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker,
                                   scheduling_strategy=strategy).remote()
            self.workers.append(Worker(rank, actor))

    def start(self, argv: Sequence[str], options: Options) -> None:
        """Rendezvous on this node's address, then every worker with its slot's variables."""
        import ray

        places = ray.get([w.actor.where.remote() for w in self.workers])
        slots = assignments([node for node, _, _ in places])
        # The address Ray gives this process's node, the one the other nodes reach it by.
        rendezvous = serve_rendezvous(ray.util.get_node_ip_address(), slots)
        cwd = None if options.working_dir else os.getcwd()  # None: the shipped copy, each on its node
        ray.get([w.actor.start.remote(argv, worker_environ(os.environ, slot, rendezvous, iface,
                                                            options.gpus_per_worker), cwd)
                 for w, slot, (_, _, iface) in zip(self.workers, slots, places)])

    # -- supervising ------------------------------------------------------------------------------
    def supervise(self) -> int:
        import ray

        caught: List[int] = []
        previous = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in FORWARDED_SIGNALS}
        try:
            calls: Dict[object, Tuple[Worker, str]] = {}
            for worker in self.workers:
                calls[worker.actor.read.remote()] = (worker, "read")
                calls[worker.actor.wait.remote()] = (worker, "wait")
            while calls:
                ready, _ = ray.wait(list(calls), num_returns=1, timeout=TICK)
                while caught:
                    self._on_signal(caught.pop(0))
                for ref in ready:
                    worker, kind = calls.pop(ref)
                    follow = self._on_read(worker, ref) if kind == "read" else self._on_wait(worker, ref)
                    if follow is not None:
                        calls[follow] = (worker, kind)
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    self.kill_at = None
                    for worker in self._running():
                        worker.actor.kill.remote()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return announce(self.prog, self._outcome())

    def _on_read(self, worker: Worker, ref):
        import ray

        try:
            chunks = ray.get(ref)
        except ray.exceptions.RayActorError:
            return None
        for stream, data in chunks:
            _write(stream, data)
        return worker.actor.read.remote() if chunks else None

    def _on_wait(self, worker: Worker, ref) -> None:
        import ray

        try:
            worker.exit_code = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            worker.lost = str(err).splitlines()[0]
        if (worker.exit_code or worker.lost) and self.failed is None and self.stopped_by is None:
            self.failed = worker
            self._stop(self.stop_signal)

    def _on_signal(self, signum: int) -> None:
        if signum in STOP_SIGNALS:
            self.stopped_by = self.stopped_by or signum
            self._stop(signum)
            return
        for worker in self._running():
            worker.actor.signal.remote(signum)

    def _stop(self, signum: int) -> None:
        for worker in self._running():
            worker.asked_to_stop = True
            worker.actor.signal.remote(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def _running(self) -> List[Worker]:
        return [w for w in self.workers if w.running]

    def _outcome(self) -> Tuple[int, str]:
        if self.failed:
            return failed_verdict(self.failed, self.workers, self.script)
        if self.stopped_by:
            return stopped_verdict(self.stopped_by, self.workers) or (0, "")
        return 0, ""


def serve_rendezvous(host: str, slots: list) -> Tuple[str, int]:
    """Horovod's gloo rendezvous (the HTTP server horovodrun runs) on `host` only, not on every
    address as horovodrun's does; it serves until the launcher exits."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
    server.init(slots)
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return host, server.server_address[1]


def _write(fd: int, data: bytes) -> None:
    try:
        _writev_all(fd, [data])
    except OSError:
        pass  # our reader is gone (BrokenPipeError): the workers go on


if __name__ == "__main__":
    sys.exit(main())
