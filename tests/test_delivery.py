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
    PYTHON, Manager, assert_delivered_once, channel_records, start_keeper, train_command, wait_until,
)


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


def test_keeper_killed_mid_trial_and_started_again_on_the_same_dir(tmp_path, manager):
    manager.start()
    command = train_command(tmp_path)
    keeper = start_keeper(tmp_path / "trial", command, manager=manager,
                          **run_env(tmp_path, T_COUNT="1000", T_GATE="500", T_HOLD="1"))
    wait_until(lambda: manager.store.acked_seq("t1") >= 501, 30, "the first half to arrive")
    manager.kill()  # the rest stays spooled (or not yet read) when the keeper dies
    (tmp_path / "go").touch()
    wait_until(lambda: (tmp_path / "wrote-0").exists(), 30, "the second half to be reported", every=0.002)
    keeper.send_signal(signal.SIGKILL)
    keeper.communicate(timeout=30)
    manager.start()
    again = start_keeper(tmp_path / "trial", command, manager=manager, **run_env(tmp_path, T_COUNT="1000"))
    code, err = finished(again)
    assert code == 0, err
    written = channel_records(tmp_path / "trial" / ".trialkit" / "channel")
    assert len(written) == 2001  # 1000 from the killed run, 1000 and a final one from the restarted run
    assert_delivered_once(manager, "t1", written, ["RUNNING", "RUNNING", "SUCCEEDED"])


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
