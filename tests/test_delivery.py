"""Every record a trial reports reaches the manager once, whatever fails on the way.

Real processes throughout: `python -m trialkit.manager.server` on loopback,
`python -m trialkit.keeper` running a training script that uses the SDK. The
channel file the SDK wrote is the ground truth the manager's rows must match.
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import time

import psutil
import pytest

from harness import (
    PYTHON, Manager, assert_delivered_once, channel_records, child_environ, start_keeper, train_command,
    wait_until,
)
from trialkit import records


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "exp")
    m.register("t1", "token-1")
    yield m
    m.close()


def run_env(tmp_path, **extra):
    return dict(T_SIGNALS=str(tmp_path), **extra)


def finished(keeper: subprocess.Popen, timeout: float = 60):
    out, err = keeper.communicate(timeout=timeout)
    return keeper.returncode, err


def test_manager_down_when_the_trial_starts_and_up_10s_later(tmp_path, manager):
    started = time.monotonic()
    keeper = start_keeper(tmp_path / "trial", train_command(tmp_path), manager=manager,
                          options=["--flush-seconds", "60"], **run_env(tmp_path, T_COUNT="300"))
    wait_until(lambda: (tmp_path / "wrote-0").exists(), 30, "the trial to report")
    time.sleep(max(0.0, started + 10 - time.monotonic()))  # the scenario: the manager is up 10 s later
    assert keeper.poll() is None, "the keeper gave up while the manager was down"
    manager.start()
    code, err = finished(keeper)
    assert code == 0, err
    assert err.count("cannot reach the manager") == 1  # said once, not at every retry
    assert "answers again" in err
    written = channel_records(tmp_path / "trial" / ".trialkit" / "channel")
    assert len(written) == 301
    assert_delivered_once(manager, "t1", written, ["RUNNING", "SUCCEEDED"])


def test_manager_restarted_in_the_middle(tmp_path, manager):
    manager.start()
    keeper = start_keeper(tmp_path / "trial", train_command(tmp_path), manager=manager,
                          **run_env(tmp_path, T_COUNT="1000", T_GATE="500"))
    wait_until(lambda: manager.store.acked_seq("t1") >= 501, 30, "the first half to arrive")
    manager.kill()
    (tmp_path / "go").touch()
    wait_until(lambda: (tmp_path / "wrote-0").exists(), 30, "the second half to be reported")
    manager.start()
    code, err = finished(keeper)
    assert code == 0, err
    assert_delivered_once(manager, "t1", channel_records(tmp_path / "trial" / ".trialkit" / "channel"),
                          ["RUNNING", "SUCCEEDED"])


def killed_with_half_delivered(tmp_path, manager, keeper, half_arrived) -> None:
    """A gated run (T_GATE, T_HOLD) of `keeper`: once `half_arrived()`, the manager killed, the second half
    reported and the keeper SIGKILLed with it undelivered (spooled or not yet read); the manager started again."""
    wait_until(half_arrived, 30, "the first half to arrive")
    manager.kill()
    (tmp_path / "go").touch()
    wait_until(lambda: (tmp_path / "wrote-0").exists(), 30, "the second half to be reported", every=0.002)
    keeper.send_signal(signal.SIGKILL)
    keeper.communicate(timeout=30)
    manager.start()


def test_keeper_killed_mid_trial_and_started_again_on_the_same_dir(tmp_path, manager):
    manager.start()
    command = train_command(tmp_path)
    keeper = start_keeper(tmp_path / "trial", command, manager=manager,
                          **run_env(tmp_path, T_COUNT="1000", T_GATE="500", T_HOLD="1"))
    killed_with_half_delivered(tmp_path, manager, keeper, lambda: manager.store.acked_seq("t1") >= 501)
    again = start_keeper(tmp_path / "trial", command, manager=manager, **run_env(tmp_path, T_COUNT="1000"))
    code, err = finished(again)
    assert code == 0, err
    written = channel_records(tmp_path / "trial" / ".trialkit" / "channel")
    assert len(written) == 2001  # 1000 from the killed run, 1000 and a final one from the restarted run
    assert_delivered_once(manager, "t1", written, ["RUNNING", "RUNNING", "SUCCEEDED"])


def stored_metrics(manager, trial_id="t1"):
    """(type, value) of the trial's stored metrics, in the store's order (by seq)."""
    return [(r["type"], r["value"]) for r in manager.store.records_for(trial_id) if r["type"] != records.STATUS]


def stored_statuses(manager, trial_id="t1"):
    return [r["value"]["status"] for r in manager.store.records_for(trial_id) if r["type"] == records.STATUS]


@pytest.mark.parametrize("second_count", [1, 0])
def test_a_run_whose_keeper_starts_on_a_fresh_trial_dir_keeps_every_record_of_the_run_before(tmp_path, manager,
                                                                                               second_count):
    """A trial started again where its spool is not (a new pod, another node) numbers a fresh spool from 1: the
    manager keeps both runs' records, each once and in order. Restart count 0 twice: AdaptDL's count, which each
    new AdaptDLJob starts again, or a keeper started by hand."""
    manager.start()
    written = []
    for count, node in ((0, "node-a"), (second_count, "node-b")):
        keeper = start_keeper(tmp_path / node, train_command(tmp_path), manager=manager,
                              **run_env(tmp_path, T_COUNT="40", TRIALKIT_RESTART_COUNT=str(count)))
        code, err = finished(keeper)
        assert code == 0, err
        written += channel_records(tmp_path / node / ".trialkit" / "channel")
    assert len(written) == 82
    assert stored_metrics(manager) == [(r["type"], r["value"]) for r in written]
    assert stored_statuses(manager) == ["RUNNING", "SUCCEEDED", "RUNNING", "SUCCEEDED"]
    assert_delivered_once(manager, "t1", written, ["RUNNING", "SUCCEEDED", "RUNNING", "SUCCEEDED"])


def test_a_second_runs_keeper_killed_and_started_again_on_its_dir_stores_nothing_twice(tmp_path, manager):
    """The second run's spool (not the trial's first) dedupes what its restarted keeper sends again."""
    manager.start()
    command = train_command(tmp_path)
    first = start_keeper(tmp_path / "node-a", command, manager=manager,
                         **run_env(tmp_path, T_COUNT="30", TRIALKIT_RESTART_COUNT="5"))
    code, err = finished(first)
    assert code == 0, err
    # Run "0" again (T_GATE and T_HOLD act in run 0): a count that did not rise, on another node.
    keeper = start_keeper(tmp_path / "node-b", command, manager=manager,
                          **run_env(tmp_path, T_COUNT="1000", T_GATE="500", T_HOLD="1"))
    killed_with_half_delivered(tmp_path, manager, keeper, lambda: len(stored_metrics(manager)) >= 31 + 500)
    again = start_keeper(tmp_path / "node-b", command, manager=manager,
                         **run_env(tmp_path, T_COUNT="1000", TRIALKIT_RESTART_COUNT="1"))
    code, err = finished(again)
    assert code == 0, err
    written = channel_records(tmp_path / "node-a" / ".trialkit" / "channel")
    written += channel_records(tmp_path / "node-b" / ".trialkit" / "channel")
    assert len(written) == 31 + 2001
    assert stored_metrics(manager)[:31] == [(r["type"], r["value"]) for r in written[:31]]  # the first run first
    assert_delivered_once(manager, "t1", written, ["RUNNING", "SUCCEEDED", "RUNNING", "RUNNING", "SUCCEEDED"])


def test_a_channel_no_spool_holds_is_numbered_by_the_collector_as_the_next_keeper_numbers_it(tmp_path, manager):
    """A keeper that died before it spooled anything leaves the channel only: the control plane's reader
    (keeper/leftover.py) numbers its records in a spool whose id it puts on disk, and the next keeper on the dir
    goes on with that spool: each record is stored once."""
    from trialkit.keeper import leftover

    trial = tmp_path / "trial"
    report = "import trialkit\nfor i in range(3): trialkit.report_intermediate_result(i)"
    done = subprocess.run([PYTHON, "-c", report], env=child_environ(TRIALKIT_TRIAL_DIR=str(trial)), timeout=60)
    assert done.returncode == 0
    left = leftover.undelivered(trial)
    assert [(r["seq"], r["value"]) for r in left] == [(1, 0), (2, 1), (3, 2)]
    assert leftover.undelivered(trial) == left  # read again: the same spool and seqs
    assert manager.store.add_records("t1", left) == left
    manager.start()
    code, err = finished(start_keeper(trial, [PYTHON, "-c", "pass"], manager=manager))
    assert code == 0, err
    assert stored_metrics(manager) == [("PERIODICAL", 0), ("PERIODICAL", 1), ("PERIODICAL", 2)]
    assert_delivered_once(manager, "t1", channel_records(trial / ".trialkit" / "channel"), ["RUNNING", "SUCCEEDED"])


def test_unsent_records_stay_spooled_and_the_next_keeper_delivers_them(tmp_path, manager):
    keeper = start_keeper(tmp_path / "trial", train_command(tmp_path), manager=manager,
                          options=["--flush-seconds", "0.5"], **run_env(tmp_path, T_COUNT="200"))
    code, err = finished(keeper)
    assert code == 0, err
    left = [line for line in err.splitlines() if "were not delivered" in line]
    assert len(left) == 1 and "203 records" in left[0] and "spool" in left[0]
    manager.start()
    again = start_keeper(tmp_path / "trial", [PYTHON, "-c", "pass"], manager=manager)
    code, err = finished(again)
    assert code == 0, err
    assert_delivered_once(manager, "t1", channel_records(tmp_path / "trial" / ".trialkit" / "channel"),
                          ["RUNNING", "SUCCEEDED", "RUNNING", "SUCCEEDED"])


def test_100000_records_all_arrive_and_the_keeper_stays_small(tmp_path, manager):
    manager.start()
    keeper = start_keeper(tmp_path / "trial", train_command(tmp_path), manager=manager,
                          options=["--flush-seconds", "120"], **run_env(tmp_path, T_COUNT="100000"))
    proc = psutil.Process(keeper.pid)
    peak = 0
    while keeper.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    code, err = finished(keeper, timeout=180)
    assert code == 0, err
    written = channel_records(tmp_path / "trial" / ".trialkit" / "channel")
    assert len(written) == 100001
    assert_delivered_once(manager, "t1", written, ["RUNNING", "SUCCEEDED"])
    # 100,000 records held in memory would take over 100 MiB; the keeper reads them back batch by batch.
    print(f"keeper peak RSS {peak >> 20} MiB")
    assert peak < 80 << 20, f"keeper peak RSS {peak >> 20} MiB"


MALFORMED = r"""
import os, trialkit
channel = os.environ["TRIALKIT_CHANNEL"]
trialkit.report_intermediate_result(1)
with open(channel, "ab") as f:
    f.write(b"junk that is not a frame\n")
trialkit.report_intermediate_result(2)
with open(channel, "ab") as f:
    f.write(b'\x1e{"type": "PERIODICAL", "val')  # torn by a crash, then the file goes on
trialkit.report_intermediate_result(3)
nni = os.path.join(os.environ["NNI_SYS_DIR"], ".nni", "metrics")
data = b'{"type": "FINAL", "sequence": 0, "value": "4"}\n'
with open(nni, "ab") as f:
    f.write(b"MEbroken" + b"ME%06d" % len(data) + data)
print("NNISDK_MEb'{not json'", flush=True)
print("NNISDK_MEb'" + '{"type": "PERIODICAL", "sequence": 9, "value": "5"}' + "'", flush=True)
"""


def test_the_record_files_dirs_exist_when_the_command_starts(tmp_path, manager):
    """A script may append to $NNI_SYS_DIR/.nni/metrics as its first act (NNI's own SDK makes the dir, a
    hand-written reporter need not): the keeper makes the dirs before the command, not as it watches them."""
    check = 'test -d "$NNI_SYS_DIR/.nni" && test -d "$(dirname "$TRIALKIT_CHANNEL")"'
    manager.start()
    keeper = start_keeper(tmp_path / "trial", ["/bin/sh", "-c", check], manager=manager)
    code, err = finished(keeper)
    assert code == 0, err


def test_malformed_records_are_skipped_with_one_warning_each(tmp_path, manager):
    manager.start()
    script = tmp_path / "bad.py"
    script.write_text(MALFORMED)
    keeper = start_keeper(tmp_path / "trial", [PYTHON, str(script)], manager=manager)
    code, err = finished(keeper)
    assert code == 0, err
    assert err.count("skipped a malformed record") == 4, err
    stored = manager.store.records_for("t1")
    # In order within a source; the sources themselves are read side by side.
    assert sorted((r["source"], r["value"]) for r in stored if r["type"] != "STATUS") == [
        ("channel", 1), ("channel", 2), ("channel", 3), ("nni", 4), ("stdout", 5)]
    status = (tmp_path / "trial" / ".trialkit" / "status.json").read_text()
    assert '"malformed_records": 4' in status


def tensorboard_scalars(logdir):
    """(tag, step, value) from tensorboardX event files, read as TFRecords."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_numeric_metrics_become_tensorboard_scalars(tmp_path, manager):
    manager.start()
    keeper = start_keeper(tmp_path / "trial", train_command(tmp_path), manager=manager,
                          TRIALKIT_TENSORBOARD_DIR=str(tmp_path / "tb"), **run_env(tmp_path, T_COUNT="5"))
    code, err = finished(keeper)
    assert code == 0, err
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert [(t, s, v) for t, s, v in scalars if t == "metric/default"] == [("metric/default", i, i) for i in range(5)]
    assert ("final/default", 0, 0.0) in scalars


# -- the keeper's parts, in process --------------------------------------------------
def spool_records(n, start=0):
    return [{"type": "PERIODICAL", "sequence": i, "value": i * 0.5, "time": 1.0, "source": "channel"}
            for i in range(start, start + n)]


def test_spool_cuts_a_torn_batch_and_keeps_the_cursor_of_the_last_whole_one(tmp_path):
    from trialkit.keeper.spool import Spool

    spool = Spool(tmp_path)
    spool.append(spool_records(3), {"channel": [1, 300]})
    spool.close()
    segment = next(tmp_path.glob("*.log"))
    whole = segment.stat().st_size
    with open(segment, "ab") as f:  # a batch cut short by SIGKILL: records without their cursor line
        f.write(b'\x1e{"seq":4,"type":"PERIODICAL","value":1}\n\x1e{"seq":5,"ty')
    again = Spool(tmp_path)
    assert (again.last_seq, again.cursor) == (3, {"channel": [1, 300]})
    assert segment.stat().st_size == whole
    again.append(spool_records(1, 3), {"channel": [1, 400]})
    assert [seq for seq, _ in again.read(0, 100, 1 << 20)] == [1, 2, 3, 4]
    again.close()


def test_spool_reads_across_segments_and_drops_acknowledged_ones(tmp_path):
    import json

    from trialkit.keeper.spool import Spool

    spool = Spool(tmp_path, segment_records=10)
    for batch in range(5):
        spool.append(spool_records(10, batch * 10), {"channel": [1, batch]})
    assert len(list(tmp_path.glob("*.log"))) == 5
    got, after = [], 0
    while True:
        batch = spool.read(after, 7, 1 << 20)
        if not batch:
            break
        got += [json.loads(line)["sequence"] for _, line in batch]
        after = batch[-1][0]
    assert got == list(range(50))
    spool.ack(35)
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["000000000031.log", "000000000041.log"]
    assert [seq for seq, _ in spool.read(35, 3, 1 << 20)] == [36, 37, 38]
    spool.ack(50)
    assert [p.name for p in tmp_path.glob("*.log")] == ["000000000041.log"]  # the newest keeps the cursor
    spool.close()
    again = Spool(tmp_path)
    assert (again.acked, again.last_seq, again.unsent, again.cursor) == (50, 50, 0, {"channel": [1, 4]})
    again.close()


def test_a_spool_keeps_its_id_and_numbering_through_a_failed_rotation_an_ack_and_a_restart(tmp_path, monkeypatch):
    """The newest segment holds the latest cursor and the spool's id; while its first batch is not written (a
    full disk), an ack keeps the segment before it, so a keeper started again goes on with the same spool."""
    import errno

    from trialkit.keeper import spool as spool_module

    spool = spool_module.Spool(tmp_path, segment_records=2)
    spool.append(spool_records(2), {"channel": [1, 2]})
    ident = spool.id

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module.os, "fdatasync", full)
    with pytest.raises(OSError):
        spool.append(spool_records(1, 2), {"channel": [1, 3]})  # a new segment, its first batch not written
    monkeypatch.undo()
    spool.ack(2)
    spool.close()
    again = spool_module.Spool(tmp_path)
    assert (again.id, again.next_seq, again.cursor) == (ident, 3, {"channel": [1, 2]})
    again.close()


def test_a_spool_from_before_spools_had_ids_keeps_none(tmp_path):
    from trialkit.keeper.spool import Spool

    (tmp_path / "000000000001.log").write_bytes(
        b'\x1e{"seq":1,"type":"PERIODICAL","value":1}\n\x1e{"cursor":{"channel":[1,9]},"next":2}\n')
    spool = Spool(tmp_path)
    assert (spool.id, spool.next_seq) == ("", 2)
    spool.append(spool_records(1), {"channel": [1, 20]})  # the batches it writes name none either
    spool.close()
    assert (Spool(tmp_path).id, Spool(tmp_path).next_seq) == ("", 3)
    assert Spool(tmp_path / "fresh").id != Spool(tmp_path / "other").id  # a fresh one's is its own


@pytest.mark.parametrize("inotify", [True, False])
def test_dir_watch_wakes_the_loop_with_inotify_or_a_timer(tmp_path, monkeypatch, inotify):
    from trialkit.keeper import watch
    from trialkit.process import EventLoop

    if not inotify:
        monkeypatch.setattr(watch, "_inotify_libc", lambda: None)
    loop = EventLoop(signals=())
    seen = []
    watcher = watch.DirWatch(loop, [tmp_path], lambda: seen.append((tmp_path / "f").exists()))
    assert watcher.event_driven is inotify
    (tmp_path / "f").write_bytes(b"x")
    assert loop.run_until(lambda: any(seen), deadline=time.monotonic() + 5)
    watcher.close()
    loop.close()


def _kernel_watches(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return sum(line.startswith("inotify wd:") for line in f)


@pytest.mark.parametrize("inotify", [True, False])
def test_a_stopped_dir_watch_has_no_kernel_watches_and_stays_quiet(tmp_path, monkeypatch, inotify):
    # The keeper stops the watch when the trial's tree is gone, so the kernel
    # frees the watches while it records the end, not inside close() on its way out.
    from trialkit.keeper import watch
    from trialkit.process import EventLoop

    if not inotify:
        monkeypatch.setattr(watch, "_inotify_libc", lambda: None)
    (tmp_path / "sub").mkdir()
    loop = EventLoop(signals=())
    seen = []
    watcher = watch.DirWatch(loop, [tmp_path, tmp_path / "sub"], lambda: seen.append(True))
    fd = watcher._fd
    if inotify:
        assert _kernel_watches(fd) == 2
    watcher.stop()
    if inotify:
        assert _kernel_watches(fd) == 0
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "sub" / "g").write_bytes(b"y")
    # Longer than the timer's period: a stopped watch neither reads events nor polls.
    assert not loop.run_until(lambda: bool(seen), deadline=time.monotonic() + 2 * watch.POLL_SECONDS)
    watcher.close()
    if inotify:
        with pytest.raises(OSError):
            os.fstat(fd)
    loop.close()


# Run 0 reports 50 results and SIGKILLs its own keeper at once (before its 20 ms batch delay is up, so the
# channel holds records the keeper never spooled); a restarted run reports 5 more and its final result.
KILLS_ITS_KEEPER = """
import os, signal, trialkit
run = int(os.environ["TRIALKIT_RESTART_COUNT"])
for i in range(50 if run == 0 else 5):
    trialkit.report_intermediate_result(run * 1000 + i)
if run == 0:
    os.kill(int(os.environ["TRIALKIT_KEEPER_PID"]), signal.SIGKILL)
    signal.pause()  # ended by the keeper's death (its parent-death signal)
trialkit.report_final_result(run)
"""


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_keeper_killed_right_after_its_trial_wrote_loses_and_doubles_nothing(tmp_path, monkeypatch, restarts):
    """Issue 29, item 1: the control plane collects a dead keeper's spool AND its channel's unspooled tail
    (keeper/leftover.py), numbered as a restarted keeper numbers them, so each record is stored once."""
    from experiment_util import experiment, experiment_id, start_cli, stored

    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, KILLS_ITS_KEEPER, maxTrialNumber=1,
                        trialConcurrency=1, tuner={"name": "GridSearch"}, maxTrialRestarts=restarts)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err  # (it exits 1 when its one trial failed)
    rows = stored(home, exp, "SELECT type, value, run FROM records WHERE type IN ('PERIODICAL', 'FINAL') ORDER BY seq")
    expected = [("PERIODICAL", str(i), 0) for i in range(50)]
    if restarts:
        expected += [("PERIODICAL", str(1000 + i), 1) for i in range(5)] + [("FINAL", "1", 1)]
    assert rows == expected  # every record once, in order
    seqs = [seq for (seq,) in stored(home, exp, "SELECT seq FROM records ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_paused_trial_activated_on_an_empty_trial_dir_keeps_the_first_runs_records(tmp_path, monkeypatch):
    """A paused trial activated where its keeper's home is not (a new pod, another node: here it is moved away
    while the trial is paused; the checkpoint stays) keeps its first run's RUNNING status and results, and the
    second run's, each once."""
    from experiment_util import RESUMABLE, experiment, paused_and_activated, runs_as_stored

    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [7]}}, RESUMABLE, maxTrialNumber=1,
                        trialConcurrency=1, trialGraceSeconds=10, tuner={"name": "GridSearch"})

    def to_a_new_node(exp, trial):
        keeper_home = home / "experiments" / exp / "trials" / trial / ".trialkit"
        keeper_home.rename(keeper_home.with_name(".trialkit-of-the-old-node"))

    exp, _ = paused_and_activated(home, [config], 2, to_a_new_node)
    statuses, runs = runs_as_stored(home, f"{exp}-00000")
    assert statuses == [(0, "RUNNING"), (0, "PREEMPTED"), (1, "RUNNING"), (1, "SUCCEEDED")]
    assert runs == [(0, "PREEMPTED", [5, 10], None), (1, "SUCCEEDED", [15, 20, 25, 30], 7)]
