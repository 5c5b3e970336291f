"""A disk that takes no writes (issue 16, point 3): a real 2 MiB tmpfs filled up, or remounted read-only.

The manager's store on such a disk: `trialkit run` keeps running, answers its
keepers 503 (they keep the records in their spools and retry), shows the
condition on the page and in one log line, marks no trial failed, and goes
on by itself once the disk takes writes again: every record a trial wrote is
stored once. The keeper's own trial dir on such a disk: the trial's status
and exit code still reach the manager, nothing spooled is lost.

Tests run as root here (mount, umount); where mounting is refused they skip,
saying why. Every mount is undone in teardown.
"""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Iterator, List

import pytest
import requests
import yaml

from harness import Manager, channel_records, child_environ, start_keeper, wait_until
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store

PYTHON = sys.executable
TIMEOUT = 120.0  # a bound for a loaded machine, never waited for on success
EXPERIMENT = "diskfull"


@contextmanager
def mounted(path: Path, *options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(['mount', *options])}): {done.stderr.strip()}")
    try:
        yield path
    finally:
        while os.path.ismount(path):  # a read-only layer a test left on top, then the mount itself
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=True)


def tmpfs(path: Path, size: str = "2m"):
    return mounted(path, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


def fill(directory: Path) -> Path:
    """Write a file until the disk refuses another byte."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)
    return filler


def remount(path: Path, mode: str) -> None:
    done = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def read_only_layer(path: Path) -> None:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True, capture_output=True)
    remount_layer = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
    assert remount_layer.returncode == 0, remount_layer.stderr


def skip_unless_read_only_mid_run(disk: Path) -> None:
    """Skip when this kernel refuses `remount,ro` while a file is open for writing, as one always is mid-run
    (SQLite's files in the manager, the spool's segment in a keeper)."""
    with open(disk / "open-for-writing", "wb"):
        done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(disk / "open-for-writing")
        pytest.skip(f"mount -o remount,ro is refused while a file is open for writing: {done.stderr.strip()}")
    remount(disk, "rw")
    os.unlink(disk / "open-for-writing")


# ---------------------------------------------------------------- the manager's disk

TRIAL = """
import os, pathlib, time, trialkit
seq = trialkit.get_sequence_id()
signals = pathlib.Path(os.environ["T_SIGNALS"])
def wait(name):
    while not (signals / name).exists():
        time.sleep(0.05)
for i in range(10):
    trialkit.report_intermediate_result(seq * 1000 + i)
if seq == 1:
    trialkit.report_final_result(seq)  # delivered before the fault; this trial ends during it
(signals / f"at10-{seq}").touch()
wait("fault")
if seq == 0:
    for i in range(10, 30):  # delivered only once the disk takes writes again
        trialkit.report_intermediate_result(seq * 1000 + i)
    (signals / "wrote-0").touch()
    wait("mended")
    trialkit.report_final_result(seq)
"""


def stored(db: Path, sql: str, *args) -> List[tuple]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        return conn.execute(sql, args).fetchall()


def page_get(url: str, path: str) -> dict:
    base, token = url.split("/?token=")
    token = token.split("#")[0]
    return requests.get(base + path, headers={"Authorization": f"Bearer {token}"}, timeout=10).json()


@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS"])
@pytest.mark.parametrize("trials_on", ["another disk", "the same disk"])
def test_the_manager_outlives_a_store_disk_that_takes_no_writes(tmp_path, fault, trials_on):
    home, signals, code = tmp_path / "home", tmp_path / "signals", tmp_path / "code"
    for folder in (signals, code, tmp_path / "trials"):
        folder.mkdir()
    (code / "trial.py").write_text(TRIAL)
    (code / "space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [1, 2, 3]}}))
    config = code / "config.yml"
    config.write_text(yaml.safe_dump({
        "searchSpaceFile": "space.json", "trialCommand": f"{PYTHON} trial.py", "trialConcurrency": 2,
        "maxTrialNumber": 2, "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local"}}))
    exp_dir = home / "experiments" / EXPERIMENT
    db = exp_dir / "trialkit.db"
    trials_dir = exp_dir / "trials"
    with ExitStack() as mounts:
        disk = mounts.enter_context(tmpfs(exp_dir))
        if fault == "EROFS":
            skip_unless_read_only_mid_run(disk)
        if trials_on == "another disk":
            # Only the manager meets the fault: the trials' dirs are a bind mount of a directory elsewhere.
            mounts.enter_context(mounted(trials_dir, "--bind", str(tmp_path / "trials")))
        # Else the keepers meet it too (their status files, spools, logs), as with all of TRIALKIT_HOME there.
        out, err = open(tmp_path / "run.out", "w+"), open(tmp_path / "run.err", "w+")
        run = subprocess.Popen([PYTHON, "-m", "trialkit.cli", "run", str(config), "--experiment-id", EXPERIMENT],
                               stdout=out, stderr=err, env=child_environ(TRIALKIT_HOME=str(home),
                                                                         T_SIGNALS=str(signals)))
        try:
            trial = [f"{EXPERIMENT}-{i:05d}" for i in range(2)]
            wait_until(lambda: (signals / "at10-0").exists() and (signals / "at10-1").exists(), TIMEOUT, "step 10")
            wait_until(lambda: stored(db, "SELECT COUNT(*) FROM records WHERE type IN ('PERIODICAL', 'FINAL')")
                       == [(21,)], TIMEOUT, "the first records to be stored")
            filler = fill(disk) if fault == "ENOSPC" else remount(disk, "ro")
            (signals / "fault").touch()
            wait_until(lambda: (signals / "wrote-0").exists(), TIMEOUT, "trial 0's records written")
            # Trial 1 ended: its keeper gave up delivering its last status and exited; the loop could not
            # record the end. Trial 0 delivers its 20 new records and gets 503s.
            wait_until(lambda: not (trials_dir / trial[1] / ".trialkit" / "keeper.pid").exists(),
                       TIMEOUT, "trial 1's keeper to exit")
            wait_until(lambda: "cannot write the store" in (tmp_path / "run.err").read_text(), TIMEOUT,
                       "the manager's line about its disk")
            page = [line.split()[-1] for line in (tmp_path / "run.out").read_text().splitlines()
                    if line.startswith("page: ")][0]
            # On the same disk a keeper that exits frees a block (its pidfile), and the manager's probe may
            # pass before the next write fails again: the page says so while the condition holds.
            seen = []
            wait_until(lambda: seen.append(page_get(page, "/api/ui/info")["disk"]) or seen[-1] is not None,
                       TIMEOUT, "the page's disk line")
            problem = seen[-1]
            assert "full" in problem if fault == "ENOSPC" else "read-only" in problem, problem
            assert run.poll() is None, "the manager died"
            statuses = dict(stored(db, "SELECT id, status FROM trials"))
            assert statuses[trial[1]] != "FAILED" and stored(db, "SELECT COUNT(*) FROM records")[0][0] < 40
            if fault == "ENOSPC":
                filler.unlink()
            else:
                remount(disk, "rw")
            (signals / "mended").touch()
            assert run.wait(timeout=TIMEOUT) == 0, (tmp_path / "run.err").read_text()
        finally:
            if run.poll() is None:
                run.send_signal(signal.SIGKILL)
                run.wait()
            out.close()
            err.close()
        log = (tmp_path / "run.err").read_text()
        rows = stored(db, "SELECT trial, type, value FROM records WHERE type IN ('PERIODICAL', 'FINAL') "
                          "ORDER BY trial, seq")
        statuses = dict(stored(db, "SELECT id, status FROM trials"))
        sent = {t: channel_records(trials_dir / t / ".trialkit" / "channel") for t in trial}
    assert "Traceback" not in log, log
    faults, mended = log.count("cannot write the store"), log.count("takes writes again; going on")
    # One line each way; on the same disk the condition may come and go with the keepers' own files.
    assert faults == mended and (faults == 1 if trials_on == "another disk" else faults >= 1), log
    assert statuses == {trial[0]: "SUCCEEDED", trial[1]: "SUCCEEDED"}
    for t in trial:
        kept = [(kind, json.loads(value)) for who, kind, value in rows if who == t]
        assert kept == [(r["type"], r["value"]) for r in sent[t]]  # every record once, in order
    print(f"{fault}, trials on {trials_on}: records sent {sum(map(len, sent.values()))}, stored {len(rows)}")


# ---------------------------------------------------------------- the keeper's own disk

KEEPER_TRIAL = """
import os, pathlib, time, trialkit
signals = pathlib.Path(os.environ["T_SIGNALS"])
for i in range(5):
    trialkit.report_intermediate_result(i)
(signals / "reported").touch()
while not (signals / "fault").exists():
    time.sleep(0.05)
for i in range(5, 25):  # some may be refused by the full disk at the source (the SDK says so)
    trialkit.report_intermediate_result(i)
trialkit.report_final_result(25)
"""


@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS"])
def test_a_keeper_on_a_disk_that_takes_no_writes_still_reports_how_the_trial_ended(tmp_path, fault):
    manager = Manager(tmp_path / "exp").start()
    manager.register("t1", "token-1")
    signals = tmp_path / "signals"
    signals.mkdir()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KEEPER_TRIAL))
    try:
        with tmpfs(tmp_path / "trialdisk") as disk:
            keeper = start_keeper(disk / "trial", [PYTHON, str(script)], manager=manager,
                                  options=["--flush-seconds", str(TIMEOUT)], T_SIGNALS=str(signals))
            wait_until(lambda: (signals / "reported").exists(), TIMEOUT, "the first reports")
            wait_until(lambda: manager.store.count_records("t1") == 6, TIMEOUT, "RUNNING and 5 results stored")
            # Read-only: a read-only bind mount over the trial's disk. Files the keeper opens from now on
            # (its status file, the spool's ack) are refused with EROFS; what it holds open stays writable,
            # as the kernel refuses to remount a file system read-only under an open writer.
            filler = fill(disk) if fault == "ENOSPC" else read_only_layer(disk)
            lines: List[str] = []
            reader = threading.Thread(target=lambda: lines.extend(keeper.stderr), daemon=True)
            reader.start()
            (signals / "fault").touch()
            # The trial ended and the keeper could not write its status file (its spool may still take a
            # small append: into a page its segment holds, or through its open file).
            wait_until(lambda: any("cannot write" in line and "status.json" in line for line in lines), TIMEOUT,
                       "the keeper's word about its status file")
            if fault == "ENOSPC":
                filler.unlink()
            else:
                subprocess.run(["umount", str(disk)], check=True, capture_output=True)
            keeper.wait(timeout=TIMEOUT)
            reader.join(TIMEOUT)
            keeper.stdout.close()
            err = "".join(lines)
            written = channel_records(disk / "trial" / ".trialkit" / "channel")
            stored_records = manager.store.records_for("t1")
    finally:
        manager.close()
    assert keeper.returncode == 0, err
    assert "Traceback" not in err, err
    statuses = [r["value"]["status"] for r in stored_records if r["type"] == "STATUS"]
    assert statuses == ["RUNNING", "SUCCEEDED"]
    metrics = [(r["type"], r["value"]) for r in stored_records if r["type"] != "STATUS"]
    assert metrics == [(r["type"], r["value"]) for r in written]
    print(f"{fault}: keeper records written {len(written) + 2}, stored {len(stored_records)}")


def test_the_progress_line_on_a_terminal_says_what_is_wrong_with_the_disk():
    from trialkit.control.progress import Progress, Snapshot

    out = io.StringIO()
    Progress(out, tty=True).update(Snapshot(1, 1, 0, 0, 0, 5.0, disk="cannot write the store in /x: the disk is full"))
    assert out.getvalue().startswith("\r\x1b[KDISK: cannot write the store in /x")  # first, before a narrow cut


def test_a_batch_the_full_store_cannot_take_gets_503_then_200_once_it_can(tmp_path):
    with tmpfs(tmp_path / "disk") as disk:
        store = Store.in_dir(disk)
        store.create_experiment("exp")
        store.add_trial("exp", "t1", sequence=0, parameters={}, token="token-1")
        server = ManagerServer(store).start()
        post = lambda seq: requests.post(  # noqa: E731
            f"{server.url}/api/v1/trials/t1/records", headers={"Authorization": "Bearer token-1"}, timeout=10,
            json={"records": [{"seq": seq, "type": "PERIODICAL", "sequence": seq, "value": "x" * 20000}]})
        try:
            assert post(1).status_code == 200
            filler = fill(disk)
            refused = post(2)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "2"
            assert "the disk is full" in refused.json()["error"] and server.disk.problem
            filler.unlink()
            assert post(2).json()["acked"] == 2 and server.disk.problem is None
        finally:
            server.stop()
            store.close()


# ---------------------------------------------------------------- the trial's own disk, filled mid-run

FILLED_TRIAL = """
import os, pathlib, time, trialkit
signals = pathlib.Path(os.environ["T_SIGNALS"])
def wait(name):
    while not (signals / name).exists():
        time.sleep(0.02)
for i in range(10):
    trialkit.report_intermediate_result(i)
(signals / "reported").touch()
wait("full")
for i in range(10, 210):  # the disk takes none of these: the SDK holds them
    trialkit.report_intermediate_result(i)
(signals / "held").touch()
wait("mended")
for i in range(210, 220):  # the first write that passes takes the held ones first, in order
    trialkit.report_intermediate_result(i)
trialkit.report_final_result(220)
"""


def test_what_a_trial_reports_while_its_disk_is_full_is_held_and_stored_once_when_space_returns(tmp_path):
    """Issue 30, item 3: a small tmpfs holds the trial dir; filled mid-run, then freed."""
    manager = Manager(tmp_path / "exp").start()
    manager.register("t1", "token-1")
    signals = tmp_path / "signals"
    signals.mkdir()
    script = tmp_path / "train.py"
    script.write_text(FILLED_TRIAL)
    try:
        with tmpfs(tmp_path / "trialdisk") as disk:
            keeper = start_keeper(disk / "trial", [PYTHON, str(script)], manager=manager,
                                  options=["--flush-seconds", str(TIMEOUT)], T_SIGNALS=str(signals))
            wait_until(lambda: manager.store.count_records("t1") == 11, TIMEOUT, "RUNNING and 10 results stored")
            filler = fill(disk)
            (signals / "full").touch()
            wait_until(lambda: (signals / "held").exists(), TIMEOUT, "the trial to report while the disk is full")
            filler.unlink()
            (signals / "mended").touch()
            _, err = keeper.communicate(timeout=TIMEOUT)
            stored_records = manager.store.records_for("t1")
    finally:
        manager.close()
    assert keeper.returncode == 0, err
    assert "Traceback" not in err, err
    metrics = [(r["type"], r["value"]) for r in stored_records if r["type"] != "STATUS"]
    assert metrics == [("PERIODICAL", i) for i in range(220)] + [("FINAL", 220)]  # every one, once, in order
    assert [r["value"]["status"] for r in stored_records if r["type"] == "STATUS"] == ["RUNNING", "SUCCEEDED"]


@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS"])
def test_an_intact_store_on_a_disk_that_takes_no_writes_is_read_and_never_called_damaged(tmp_path, fault):
    """Issue 29, items 2 and 3: readers read it (read only when they must); start and resume say one line."""
    home = tmp_path / "home"
    code = tmp_path / "code"
    code.mkdir()
    (code / "config.yml").write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "true", "trialConcurrency": 1,
        "maxTrialNumber": 1, "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local"}}))
    environ = child_environ(TRIALKIT_HOME=str(home))
    cli = lambda *args: subprocess.run([PYTHON, "-m", "trialkit.cli", *args], env=environ,  # noqa: E731
                                       capture_output=True, text=True, timeout=TIMEOUT)
    with tmpfs(home) as disk:
        store = Store.in_dir(disk / "experiments" / "e1")
        store.create_experiment("e1", config=yaml.safe_load((code / "config.yml").read_text()), status="STOPPED")
        store.add_trial("e1", "e1-00000", sequence=0, parameters={"x": 1}, token=None)
        db = disk / "experiments" / "e1" / "trialkit.db"
        kept = ("-wal", "-shm") if fault == "EROFS" else ()
        for suffix in kept:  # as a manager killed leaves them: SQLite then opens the store without a write
            shutil.copy(f"{db}{suffix}", f"{db}{suffix}.kept")
        store.close()
        for suffix in kept:
            os.replace(f"{db}{suffix}.kept", f"{db}{suffix}")
        if fault == "ENOSPC":
            fill(disk)
        else:
            remount(disk, "ro")
        reads = {args: cli(*args) for args in (("experiment", "list"), ("experiment", "show", "e1"),
                                                ("trial", "list", "e1"), ("experiment", "export", "e1"))}
        resumed = cli("experiment", "resume", "e1")
        started = cli("run", str(code / "config.yml"))
        listed_after = cli("experiment", "list")
    for args, done in reads.items():
        assert done.returncode == 0 and "e1" in done.stdout, (args, done.stdout, done.stderr)
        assert "DAMAGED" not in done.stdout + done.stderr and "remove" not in done.stderr, (args, done.stderr)
    for done in (resumed, started):
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr and "damaged" not in done.stderr, done.stderr
    for done in (resumed, started):  # the store's or the pools' lease table: the disk is named, not the data
        assert "cannot open the store" in done.stderr and "for writing" in done.stderr, done.stderr
    assert "DAMAGED" not in listed_after.stdout, listed_after.stdout  # a refused start leaves no empty store


ENDS_WHILE_FULL = """
import os, pathlib, time, trialkit
signals = pathlib.Path(os.environ["T_SIGNALS"])
for i in range(10):
    trialkit.report_intermediate_result(i)
(signals / "reported").touch()
while not (signals / "full").exists():
    time.sleep(0.02)
for i in range(10, 110):  # the disk takes none of these, and the trial ends before it takes writes again
    trialkit.report_intermediate_result(i)
trialkit.report_final_result(110)
"""


def test_a_trial_that_ends_while_its_disk_is_full_hands_what_it_held_to_the_keeper(tmp_path):
    """Issue 30, item 3: at exit the SDK gives the keeper what the disk refused as NNISDK_MEb stdout lines; the
    keeper holds them in memory and spools them once the disk takes writes, within its flush."""
    manager = Manager(tmp_path / "exp").start()
    manager.register("t1", "token-1")
    signals = tmp_path / "signals"
    signals.mkdir()
    script = tmp_path / "train.py"
    script.write_text(ENDS_WHILE_FULL)
    try:
        with tmpfs(tmp_path / "trialdisk") as disk:
            keeper = start_keeper(disk / "trial", [PYTHON, str(script)], manager=manager,
                                  options=["--flush-seconds", str(TIMEOUT)], T_SIGNALS=str(signals))
            wait_until(lambda: manager.store.count_records("t1") == 11, TIMEOUT, "RUNNING and 10 results stored")
            lines: List[str] = []
            reader = threading.Thread(target=lambda: lines.extend(keeper.stderr), daemon=True)
            reader.start()
            filler = fill(disk)
            (signals / "full").touch()
            wait_until(lambda: any("records wait in memory" in line for line in lines), TIMEOUT,
                       "the keeper to hold the trial's stdout records")
            filler.unlink()
            keeper.wait(timeout=TIMEOUT)
            reader.join(TIMEOUT)
            keeper.stdout.close()
            stored_records = manager.store.records_for("t1")
    finally:
        manager.close()
    err = "".join(lines)
    assert keeper.returncode == 0 and "Traceback" not in err, err
    metrics = [(r["type"], r["value"]) for r in stored_records if r["type"] != "STATUS"]
    # Every one, once; in order within each way it came (the channel's last page may still take a few, which
    # the keeper reads after the stdout lines it holds: the two ways are not ordered between them).
    assert sorted(metrics) == [("FINAL", 110)] + [("PERIODICAL", i) for i in range(110)]
    for source in ("channel", "stdout"):
        values = [r["value"] for r in stored_records if r["source"] == source and r["type"] == "PERIODICAL"]
        assert values == sorted(values)
    assert any(r["source"] == "stdout" for r in stored_records if r["type"] != "STATUS")  # what the disk refused
    assert [r["value"]["status"] for r in stored_records if r["type"] == "STATUS"] == ["RUNNING", "SUCCEEDED"]


ENDS_FULL_AND_STAYS_FULL = """
import os, pathlib, time, trialkit, trialkit.sdk
signals = pathlib.Path(os.environ["T_SIGNALS"])
for i in range(10):
    trialkit.report_intermediate_result(i)
while not (signals / "full").exists():
    time.sleep(0.02)
trialkit.sdk.HELD_BYTES = 3000  # a small bound: some are held (handed to the keeper at exit), the rest dropped
for i in range(10, 110):  # the disk takes none of these (but what the channel's last page still holds)
    trialkit.report_intermediate_result(i)
trialkit.report_final_result(110)
"""


def test_a_trial_that_ends_while_its_disk_stays_full_says_in_its_record_how_many_records_it_lost(tmp_path):
    """Issue 30, item 3: the disk stays full through the keeper's end. The keeper frees the room it reserved and
    spools its final status there, saying how many of the trial's records were never written: exactly those
    the store lacks. `trialkit trial show` prints it."""
    from trialkit.manager import paths

    trial_id = "exp-00000"
    manager = Manager(paths.experiments_root() / "exp").start()
    manager.register(trial_id, "token-1")
    signals = tmp_path / "signals"
    signals.mkdir()
    script = tmp_path / "train.py"
    script.write_text(ENDS_FULL_AND_STAYS_FULL)
    try:
        with tmpfs(tmp_path / "trialdisk") as disk:
            keeper = start_keeper(disk / "trial", [PYTHON, str(script)], manager=manager, trial_id=trial_id,
                                  options=["--flush-seconds", "4"], T_SIGNALS=str(signals))
            wait_until(lambda: manager.store.count_records(trial_id) == 11, TIMEOUT, "RUNNING and 10 results stored")
            fill(disk)
            (signals / "full").touch()
            _, err = keeper.communicate(timeout=TIMEOUT)  # the disk is still full when it exits
            written = channel_records(disk / "trial" / ".trialkit" / "channel")
            on_disk = json.loads((disk / "trial" / ".trialkit" / "status.json").read_text())
            stored_records = manager.store.records_for(trial_id)
    finally:
        manager.close()
    assert keeper.returncode == 0 and "Traceback" not in err, err
    metrics = [(r["type"], r["value"]) for r in stored_records if r["type"] != "STATUS"]
    # Stored once each: what the SDK wrote to its channel (the last page of the file still took a few) and
    # what the keeper's spool still took of those it held and handed over on stdout.
    assert len(set(metrics)) == len(metrics) and set(metrics) >= {(r["type"], r["value"]) for r in written}
    assert set(metrics) <= {("PERIODICAL", i) for i in range(110)} | {("FINAL", 110)}
    statuses = [r["value"] for r in stored_records if r["type"] == "STATUS"]
    assert [s["status"] for s in statuses] == ["RUNNING", "SUCCEEDED"]
    lost = 111 - len(metrics)  # 110 results and a final one reported: the rest never reached the store
    print(f"written to the channel {len(written)}, stored {len(metrics)}, lost {lost}")
    assert lost > 0 and statuses[-1]["lost"] == lost, (lost, statuses[-1], err)
    assert on_disk["status"] == "SUCCEEDED" and on_disk["lost"] == lost
    shown = subprocess.run([PYTHON, "-m", "trialkit.cli", "trial", "show", trial_id], env=child_environ(
        TRIALKIT_HOME=os.environ["TRIALKIT_HOME"]), capture_output=True, text=True, timeout=TIMEOUT)
    assert shown.returncode == 0, shown.stderr
    assert f"lost           {lost} records" in shown.stdout, shown.stdout
