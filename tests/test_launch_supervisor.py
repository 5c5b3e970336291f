"""The fail-fast supervisor under an engine that never stops a worker itself.

torchrun, deepspeed and horovodrun tear their workers down when one fails, so
with them a test cannot tell whether trialkit's supervisor did. Here the engine
is a shell that starts every worker under wrap_rank and waits for all of them:
when one rank dies, only the supervisor can stop the others. No torch needed.
"""
from __future__ import annotations

import psutil

from launch_support import PY, Proc, launch_env, write

# The supervisor as every launcher runs it (launcher.supervise), with the engine's argv given as is.
SUPERVISE = """
import os, sys
from trialkit.launch.supervisor import Supervisor
grace, script, *engine = sys.argv[1:]
sys.exit(Supervisor("supervise", "sh", script, float(grace)).run(engine, os.environ))
"""

# SIGTERM runs a handler that says so and exits 143; otherwise it waits for ever.
WORKER = """
import os, signal, sys
rank = sys.argv[1]
def on_term(signum, frame):
    print(f"handler rank={rank} signal={signal.Signals(signum).name}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print(f"ready rank={rank} pid={os.getpid()}", flush=True)
while True:
    signal.pause()
"""

# `sh -c ENGINE PYTHON WORKER RANK...`: starts every rank and waits for all, whatever happens to any:
# no fail-fast of its own.
ENGINE = 'w="$1"; shift; for r in "$@"; do "$0" -m trialkit.launch.wrap_rank "$r" -- "$0" "$w" "$r" & done; wait'


def start(tmp_path, ranks=(0, 1), grace: float = 10.0) -> tuple:
    supervise = write(tmp_path, "supervise.py", SUPERVISE)
    worker = write(tmp_path, "worker.py", WORKER)
    proc = Proc([PY, str(supervise), str(grace), "worker.py", "sh", "-c", ENGINE, PY, str(worker), *map(str, ranks)],
                launch_env(tmp_path))
    pids = {rank: int(proc.wait_for(rf"\[rank={rank}\] ready rank={rank} pid=(\d+)").group(1)) for rank in ranks}
    return proc, pids


def test_a_rank_killed_under_an_engine_that_waits_for_all_stops_the_other_through_its_handler(tmp_path):
    # The grace is far beyond the handler's time: a survivor shot at its end would print no handler line.
    proc, pids = start(tmp_path, grace=30.0)
    psutil.Process(pids[1]).kill()
    assert proc.finish() == 137
    assert "[rank=0] handler rank=0 signal=SIGTERM\n" in proc.text, proc.text
    assert proc.err_lines[-1] == ("supervise: rank 1 failed with signal SIGKILL (exit 137) running worker.py; "
                                  "stopped the other workers")
    assert not any(psutil.pid_exists(pid) for pid in pids.values())


def test_a_lone_worker_fails_without_claiming_to_have_stopped_others(tmp_path):
    proc, pids = start(tmp_path, ranks=(0,))
    psutil.Process(pids[0]).kill()
    assert proc.finish() == 137
    assert proc.err_lines[-1] == "supervise: rank 0 failed with signal SIGKILL (exit 137) running worker.py"
