"""Many experiments on one resource pool, and how a control plane waiting for its slots is woken.

Real experiments (`trialkit run`, keepers, trials) on a pool of pools.yml, checked from the trials' own
notes of their start and end; the waking from real processes that release a lease or die holding one.
bench/bench_pools.py runs the same at scale (50 experiments of 20 trials on 4 slots) and times it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

from experiment_util import TIMEOUT, experiment, experiment_id, export, start_cli
from gpu_util import most_at_once
from pools_util import finish, home, pool_of, start_holder  # noqa: F401 (home: a fixture)

# Notes its start, holds its slot a moment, notes its end (one write each: whole), reports.
NOTED = """
import os, time, trialkit
p = trialkit.get_next_parameter()
def note(kind):
    fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{{kind}} {{time.time()}} {{os.environ['TRIALKIT_TRIAL_ID']}}\\n".encode())
    os.close(fd)
note("start")
time.sleep(0.2)
note("end")
trialkit.report_final_result(p["x"])
"""
SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}}
LISTEN_SECONDS = 30.0  # a Listener's look all the same, made long here: a wake-up before it was an event


def runs(log: Path) -> Dict[str, List[Dict[str, float]]]:
    """trial id -> its runs ({start, end}), from the trials' own notes."""
    out: Dict[str, List[Dict[str, float]]] = {}
    for line in log.read_text().splitlines():
        kind, when, trial = line.split()
        if kind == "start":
            out.setdefault(trial, []).append({"start": float(when), "end": float("inf")})
        else:
            out[trial][-1]["end"] = float(when)
    return out


def test_six_experiments_on_two_slots_never_run_more_than_two_trials_and_each_trial_once(tmp_path, home):
    pool_of(home, 2)
    log = tmp_path / "notes"
    procs = [start_cli("run", experiment(tmp_path, SPACE, NOTED.format(log=str(log)), name=f"e{i}",
                                         trialConcurrency=2, maxTrialNumber=3)) for i in range(6)]
    ids = [experiment_id(proc.stdout.readline()) for proc in procs]
    for proc in procs:
        finish(proc)
    found = runs(log)
    assert sorted(found) == sorted(f"{exp}-{n:05d}" for exp in ids for n in range(3))  # every trial, none other
    assert all(len(trial_runs) == 1 for trial_runs in found.values()), found  # each once
    spans = [run for trial_runs in found.values() for run in trial_runs]
    assert most_at_once(spans) <= 2, spans  # each experiment alone would run 2: six would run 12 at once
    for exp in ids:
        assert [row["status"] for row in export(exp)] == ["SUCCEEDED"] * 3


# Another process (as another experiment's control plane) holding a lease of the default pool; it releases it
# when told "release", ends at the next line.
HOLDER = """
import sys
from trialkit.platforms import pools
pool = pools.open_pool()
assert pool.take("other-00000", "other", 1)
print("taken", flush=True)
if sys.stdin.readline().strip() == "release":
    pool.release("other-00000")
    print("released", flush=True)
sys.stdin.readline()
"""


def tell(holder: subprocess.Popen, line: str) -> None:
    holder.stdin.write(line + "\n")
    holder.stdin.flush()


@contextlib.contextmanager
def listening(home: Path) -> Iterator[tuple]:
    """(pool, holder, listener): a 1-slot pool, another process holding its slot, a Listener on the home."""
    from trialkit.platforms import pool_events, pools

    pool_of(home, 1)
    pool = pools.open_pool()
    holder = start_holder(HOLDER, stdin=subprocess.PIPE)
    listener = pool_events.Listener(home)
    try:
        yield pool, holder, listener
    finally:
        holder.kill()
        holder.communicate(timeout=TIMEOUT)
        listener.close()
        pool.close()


def woken(listener, holders: list, wake: Callable[[], None]) -> float:
    """Seconds the listener waited, `wake` called from another thread 0.5 s into its wait."""
    threading.Timer(0.5, wake).start()
    began = time.monotonic()
    listener.wait(holders, timeout=LISTEN_SECONDS)
    return time.monotonic() - began


def test_a_lease_released_by_another_process_wakes_a_waiting_listener_at_once(home):
    with listening(home) as (pool, holder, listener):
        # no pidfd to watch: only the release's word wakes it
        woke = woken(listener, [], lambda: tell(holder, "release"))
        assert holder.stdout.readline().strip() == "released"
    assert woke < LISTEN_SECONDS / 2  # told, not the look all the same


def test_a_holder_sigkilled_with_its_lease_wakes_a_waiting_listener(home):
    from trialkit.platforms import pools

    with listening(home) as (pool, holder, listener):
        holders = pool.holders()
        assert holders == [(holder.pid, pools.Holder.of(holder.pid).ticks)]
        woke = woken(listener, holders, lambda: holder.send_signal(signal.SIGKILL))  # it releases nothing
        holder.communicate(timeout=TIMEOUT)
        assert woke < LISTEN_SECONDS / 2  # its pidfd, not the look all the same
        assert pool.take("next-00000", "next", 1)  # the pool's one slot: the dead holder's
        me = pools.Holder.of(os.getpid())
        assert pool.holders() == [(me.pid, me.ticks)]


def test_a_look_at_the_pool_that_fails_is_said_and_the_waiter_goes_on(tmp_path, home):
    """A fault in one look (here the lease table's read raising as a full disk or a damaged file does) must not
    end the waiter: its trials would wait for ever. They say why, and start once the slot is free."""
    import sqlite3

    from trialkit.platforms import pools
    from trialkit.platforms.base import TrialSpec
    from trialkit.platforms.local import LocalConfig, Platform

    pool_of(home, 1)
    holder = pools.open_pool()
    assert holder.take("other-00000", "other", 1)
    platform = Platform(LocalConfig(), tmp_path / "exp1")
    ended, reasons = threading.Event(), []
    platform.on_end = lambda handle: ended.set()
    platform.on_waiting = lambda handle, why: reasons.append(why)
    could_take, looks = platform._slots.could_take, []

    def fails_once(*args):
        looks.append(args)
        if len(looks) == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return could_take(*args)

    platform._slots.could_take = fails_once
    platform.submit(TrialSpec("exp1", "exp1-00000", 0, "true", env={"TRIALKIT_COMMAND": "true"}))
    deadline = time.monotonic() + TIMEOUT
    while len(reasons) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reasons == ["waiting for 1 slot of pool default: 0 of 1 free",
                       "waiting for slots: pool default could not be read (OperationalError: disk I/O error)",
                       "waiting for 1 slot of pool default: 0 of 1 free"]
    holder.release("other-00000")
    assert ended.wait(TIMEOUT)
    assert platform.status("exp1-00000").status == "SUCCEEDED", platform.status("exp1-00000")
    holder.close()
