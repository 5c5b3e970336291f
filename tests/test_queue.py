"""The job queue: its order, kept in the store, and a real experiment starting trials in that order."""
from __future__ import annotations

import json

import pytest
import requests

from experiment_util import by_sequence, cli, experiment, experiment_id, export, reported, start_cli, trial_status
from harness import wait_until
import k8s_schemas
from trialkit.control import admin
from trialkit.control.queue import JobQueue, Move, jobs
from trialkit.manager.store import Store
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import kubeflow
from trialkit.statuses import PREEMPTED, RUNNING
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.pools import DEFAULT_PRIORITY
from trialkit.platforms.kubernetes.render import render_trial
from trialkit.web import queries
from trialkit.web.catalog import Database

WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# ---------------------------------------------------------------- the order, without processes

def queued(tmp_path, count: int):
    """A store with `count` trials of experiment q, all queued at the default priority, and its JobQueue."""
    store = Store(tmp_path / "q.db")
    store.create_experiment("q", {"experimentName": "queued"})
    queue = JobQueue(store)
    ids = [f"q-{n:05d}" for n in range(count)]
    for n, trial_id in enumerate(ids):
        store.add_trial("q", trial_id, sequence=n, parameters={}, token=None)
        queue.track(trial_id, DEFAULT_PRIORITY)
        queue.push(trial_id)
    return store, queue, ids


def test_smaller_priority_first_then_the_order_of_joining(tmp_path):
    store, queue, (a, b, c, d) = queued(tmp_path, 4)
    assert queue.order() == [a, b, c, d] and queue.head() == a
    queue.apply(Move(c, priority=5))
    queue.apply(Move(d, priority=50))
    assert queue.order() == [c, a, b, d]
    queue.apply(Move(b, ahead_of=a))  # takes a's priority and the place before it
    assert queue.order() == [c, b, a, d]
    queue.apply(Move(d, behind_of=c))  # from priority 50 to c's 5, right after it
    assert queue.order() == [c, d, b, a] and queue.priority(d) == 5
    queue.remove(c)
    queue.push(c)  # back in: behind every trial of its priority, ahead of bigger numbers
    assert queue.order() == [d, c, b, a]
    # The store holds the same order: `trialkit job list` and a resumed experiment read it there.
    assert [job["id"] for job in jobs(store, "q")] == queue.order()
    again = JobQueue(store)
    for row in store.trials("q"):
        again.track(row["id"], row["priority"], row["position"])
    assert again.order() == queue.order()
    # The page without a running loop to ask orders them by priority alone, smaller first, then sequence.
    page = Database(tmp_path / "q.db")
    with page.reading() as db:
        assert [row["id"] for row in queries.queue(db, "q", None)] == [c, d, a, b]
    page.close()
    store.close()


def test_the_job_list_puts_running_first_and_paused_last(tmp_path):
    store, queue, (a, b, c) = queued(tmp_path, 3)
    queue.remove(a)
    store.set_status(a, RUNNING)
    queue.remove(c)
    store.set_status(c, PREEMPTED)
    assert [(job["id"], job["status"], job["slots_acquired"], job["slots_needed"], job["position"])
            for job in jobs(store, "q")] == [(a, "RUNNING", 1, 1, 0), (b, "QUEUED", 0, 1, 1), (c, "PAUSED", 0, 1, 2)]
    store.close()


@pytest.mark.parametrize("text, move", [
    ("q-00001.priority=-3", Move("q-00001", priority=-3)),
    ("q-00001.ahead-of=q-00002", Move("q-00001", ahead_of="q-00002")),
    ("q-00001.behind-of=q-00002", Move("q-00001", behind_of="q-00002")),
])
def test_batch_updates_read_as_moves(text, move):
    assert Move.parse(text) == move
    assert Move.from_json(json.loads(json.dumps(move.to_json()))) == move


@pytest.mark.parametrize("text", ["q-00001", "q-00001.priority", "q-00001.priority=high", "q-00001.pool=a",
                                  ".priority=1"])
def test_unreadable_batch_updates_are_user_errors(text):
    with pytest.raises(UserError):
        Move.parse(text)


# ---------------------------------------------------------------- Kubernetes

def pod_priority_classes(classes, priority: int):
    section = {"platform": "kubeflow", "managerAddress": "10.0.0.2", "dockerImage": "train:1",
               "master": {"replicas": 1}, "worker": {"replicas": 1}, "priorityClasses": classes}
    spec = TrialSpec("q", "q-00000", 0, "python3 train.py", env={"TRIALKIT_TOKEN": "t"}, priority=priority)
    objects = render_trial(kubeflow.parse_section(section, "trainingService"), spec)
    k8s_schemas.validate_objects(objects)
    return {template["spec"].get("priorityClassName") for obj in objects for template in k8s_schemas.pod_templates(obj)}


@pytest.mark.parametrize("priority, named", [(-5, "high"), (1, "high"), (2, "normal"), (42, "normal"), (43, None)])
def test_a_trials_priority_picks_the_mapped_priority_class(priority, named):
    assert pod_priority_classes({42: "normal", "1": "high"}, priority) == {named}


@pytest.mark.parametrize("classes, says", [(["high"], "expected a mapping"),
                                           ({"ten": "high"}, "'ten' is not a whole number"),
                                           ({10: "High_Priority"}, "not a PriorityClass name")])
def test_unusable_priority_classes_are_user_errors(classes, says):
    with pytest.raises(UserError, match=says):
        pod_priority_classes(classes, 0)


# ---------------------------------------------------------------- a real experiment

# Run 0 of every trial but the last (n=4) notes its start and holds its slot
# until stopped; a restarted trial, and the last, note their start and finish at once.
ORDERED = """
import os, signal, sys, trialkit
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
n = trialkit.get_next_parameter()["n"]
with open({order!r}, "a") as f:
    f.write(f"{{n}}\\n")
if os.environ["TRIALKIT_RESTART_COUNT"] == "0" and n < 4:
    trialkit.report_intermediate_result(n)
    signal.sigwait([signal.SIGTERM])
    sys.exit(143)
trialkit.report_final_result(n)
"""


def ok(*args) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused(*args) -> str:
    done = cli(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    return done.stderr


def test_one_slot_starts_waiting_trials_in_the_order_their_priorities_say(tmp_path, home):
    order_file = tmp_path / "order"
    config = experiment(tmp_path, {"n": {"_type": "choice", "_value": [0, 1, 2, 3, 4]}},
                        ORDERED.format(order=str(order_file)), trialConcurrency=1, maxTrialNumber=5,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    t0, t1, t2, t3 = (f"{exp}-{n:05d}" for n in range(4))
    # Pause 0, 1 and 2 as each holds the one slot; 3 then holds it, and 0, 1, 2 are activated to wait.
    for trial, after in ((t0, t1), (t1, t2), (t2, t3)):
        wait_until(lambda: reported(home, trial) == 1, WAIT, f"{trial} to run")
        ok("trial", "pause", trial)
    wait_until(lambda: reported(home, t3) == 1, WAIT, f"{t3} to run")
    for trial in (t0, t1, t2):
        ok("trial", "activate", trial)
    listed = json.loads(ok("job", "list", "--json"))
    assert [(job["id"], job["status"]) for job in listed] == \
        [(t3, "RUNNING"), (t0, "QUEUED"), (t1, "QUEUED"), (t2, "QUEUED")]

    assert {job["priority"] for job in listed} == {42}  # the config's default, as a pool's job
    ok("job", "update", t2, "--priority", "1")  # smaller first: ahead of t0 and t1 (42)
    ok("job", "update-batch", f"{t1}.ahead-of={t0}")
    assert "running" in refused("job", "update", t3, "--priority", "9")
    assert f"no trial {exp}-00099" in refused("job", "update", f"{exp}-00099", "--ahead-of", t0)
    assert f"no trial {exp}-00099" in refused("job", "update-batch", f"{t0}.priority=7", f"{exp}-00099.priority=1")
    assert "cannot read" in refused("job", "update-batch", f"{t0}.priority")
    table = ok("job", "list", "--experiment", exp)
    assert [line.split()[1] for line in table.splitlines()[2:]] == [t3, t2, t1, t0]  # t0's 7 was refused with the batch

    # The page and the admin routes act through the CLI's action table: the page's priority button moves t0 to
    # the front, the admin route's order says so, its priority action puts t0 at the back, behind the
    # experiment's priority (42): the tuner's next trial, t4, starts before it. The page's queue view shows the
    # loop's order (by priority and sequence alone, t0 would be ahead of t1).
    proc.stdout.readline()  # manager: ...
    base, token = proc.stdout.readline().split()[-1].split("#")[0].split("/?token=")  # page: URL?token=T#/exp/ID
    page = {"Authorization": f"Bearer {token}"}
    moved = requests.post(f"{base}/api/ui/experiments/{exp}/trials/{t0}/priority", json={"priority": 0},
                          headers=page, timeout=WAIT)
    assert moved.status_code == 200, moved.text
    assert admin.act(exp, "queue", "order") == {"queue": [t0, t2, t1]}
    assert admin.act(exp, "trial", "priority", t0, body={"priority": 50}) == {"queue": [t2, t1, t0]}
    view = requests.get(f"{base}/api/ui/experiments/{exp}/queue", headers=page, timeout=WAIT).json()
    assert [row["id"] for row in view["trials"]] == [t3, t2, t1, t0]

    ok("trial", "kill", t3)  # frees the slot: the queue's head starts, then the next
    assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    assert order_file.read_text().split() == ["0", "1", "2", "3", "2", "1", "4", "0"]
    rows = by_sequence(export(exp))
    assert [(rows[n]["status"], rows[n]["restart_count"]) for n in range(5)] == \
        [("SUCCEEDED", 1)] * 3 + [("USER_CANCELED", 0), ("SUCCEEDED", 0)]
    assert trial_status(home, t3) == "USER_CANCELED"
