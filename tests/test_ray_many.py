"""Many Ray trials at once, small (issue 19): 20 trials at trialConcurrency 10 on the session's two-raylet cluster.

Each trial asks for 0.08 CPUs, so ten fit on the cluster's four CPUs at once
(one CPU each: four). Each leaves a marker and waits until ten markers exist:
the first ten can only get past that together, so the experiment succeeds
only if ten ran at once (no clock involved). Then every trial SUCCEEDED, ran
once (one marker each, restart count 0, one final result stored), and nothing
is left on the cluster. bench/bench_ray_many.py runs the 200 trials at 50.

The trials start as processes of one agent a node (trialkit/ray/agent.py),
not as a Ray worker each: while the twenty run, the Ray worker processes the
nodes start are counted, and they are far fewer than the trials.

A submit creates the trial's named placement group without looking its name
up first; a name still held by a group an earlier control plane left (its
trial ended while nobody collected it) is freed, and the trial starts.
"""
from __future__ import annotations

import threading
from typing import Set

import psutil
import pytest

from experiment_util import cli, experiment, experiment_id, export, stored
from harness import Manager, wait_until
from test_ray_platform import REPORTING, WHERE, final, spec
from trialkit import records
from trialkit.platforms import load
from trialkit.platforms.ray import parse_section
from trialkit.statuses import SUCCEEDED

pytestmark = pytest.mark.slow

TRIALS, CONCURRENCY = 20, 10
BARRIER = """
import os, pathlib, sys, time, trialkit
p = trialkit.get_next_parameter()
markers = pathlib.Path(p["markers"])
(markers / f"{p['x']}-{os.getpid()}").touch()
deadline = time.monotonic() + 90  # ten start in ~10 s on a loaded machine; fewer at once never get past
while len(list(markers.iterdir())) < p["together"]:
    if time.monotonic() > deadline:
        sys.exit(f"only {len(list(markers.iterdir()))} trials ran at once")
    time.sleep(0.2)
trialkit.report_final_result(p["x"])
"""


class WorkerCount:
    """The Ray worker processes (Ray titles them `ray::...`) the cluster's nodes start while it runs."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.before = self.workers()
        self.seen: Set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def workers(self) -> Set[int]:
        found = set()
        for node in self.cluster.nodes.values():
            try:
                processes = psutil.Process(node.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for proc in processes:
                try:
                    if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::"):
                        found.add(proc.pid)
                except psutil.Error:
                    continue
        return found

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.seen |= self.workers()

    def new(self) -> Set[int]:
        self._stop.set()
        self._thread.join()
        return self.seen - self.before


def test_twenty_ray_trials_ten_at_once_each_once_nothing_left(ray_cluster, tmp_path, monkeypatch):
    if "node2" not in ray_cluster.nodes:
        ray_cluster.start_node("node2")
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    markers = tmp_path / "markers"
    markers.mkdir()
    space = {"x": {"_type": "choice", "_value": list(range(TRIALS))},
             "markers": {"_type": "choice", "_value": [str(markers)]},
             "together": {"_type": "choice", "_value": [CONCURRENCY]}}
    config = experiment(tmp_path, space, BARRIER, maxTrialNumber=TRIALS, trialConcurrency=CONCURRENCY,
                        nniManagerIp="127.0.0.1", tuner={"name": "GridSearch"},
                        trainingService={"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 0.08})
    workers = WorkerCount(ray_cluster)
    done = cli("run", config, timeout=280)
    started = workers.new()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # An agent a node, and what Ray itself starts (the driver's pool): not a worker a trial.
    assert len(started) < TRIALS // 2, f"{len(started)} Ray workers started for {TRIALS} trials"
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = export(exp)
    assert sorted(row["parameters"]["x"] for row in rows) == list(range(TRIALS)), "each trial once, none lost"
    for row in rows:
        assert (row["status"], row["restart_count"], row["final"]) == ("SUCCEEDED", 0, row["parameters"]["x"]), row
    assert sorted(int(name.partition("-")[0]) for name in (p.name for p in markers.iterdir())) == list(range(TRIALS)), \
        "each trial's command ran once"
    assert stored(home, exp, "SELECT COUNT(*) FROM records WHERE type='FINAL'")[0][0] == TRIALS
    ray_cluster.wait_clean()


def test_a_trial_whose_name_an_earlier_group_holds_starts_again(ray_cluster, tmp_path):
    import ray

    manager = Manager(tmp_path / "manager").start()
    code = tmp_path / "code"
    code.mkdir()
    config = parse_section({"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 0.08}, WHERE)
    earlier, later = (load("ray").Platform(config, tmp_path / "exp") for _ in range(2))
    earlier.on_end = later.on_end = lambda handle: None
    # The earlier run's keeper is still there when the later control plane starts the trial (here its script
    # lingers after its result; under load a keeper's end lags its result alike): it is killed and forgotten, not
    # left to hold its agent for ever or to refuse the later run's start on the same node.
    lingers = tmp_path / "lingered"
    try:
        again = spec("again", f"{REPORTING}\nimport pathlib, time\nmark = pathlib.Path({str(lingers)!r})\n"
                              f"if not mark.exists():\n    mark.touch()\n    time.sleep(600)\n", code, manager)
        earlier.submit(again)
        # Its result is never collected (that control plane is gone): its agent keeps it, its group the name.
        wait_until(lambda: [r for r in manager.store.records_for("again") if r["type"] == records.FINAL], 60,
                   "the first run's final result", every=0.2)
        assert later.submit(again) == "again"
        assert final(later, "again").status == SUCCEEDED
        assert len([r for r in manager.store.records_for("again") if r["type"] == records.FINAL]) == 2
    finally:
        manager.close()
        ray.shutdown()
    ray_cluster.wait_clean()  # the earlier run was discarded, the later one collected: the agents went
