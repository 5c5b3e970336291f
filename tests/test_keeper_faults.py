"""The keeper under faults: real processes, real signals, nothing left behind.

Every case waits for events (a line the trial prints, the keeper's exit), never
for time to pass, except where time is what is tested (the grace clock). Each
checks with psutil that the processes it learnt of are gone; conftest checks
that nothing the test started (tagged through the environment) is left.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import textwrap
import threading
import time

import pytest

from keeper_util import PYTHON, KEEPER, Proc, assert_gone, keeper, numbers_after, py, status, trial_dir

STOP_WAITS_FOR = "while True: time.sleep(60)"


def test_child_ignoring_sigterm_is_killed_after_the_grace(trial_env):
    k = keeper(["sh", "-c", "trap '' TERM; echo ready $$; sleep 600"], trial_env, "--grace", "1")
    child = numbers_after(k.expect(b"ready"), b"ready")[0]
    sent = time.monotonic()
    k.signal(signal.SIGTERM)
    assert k.wait() == 137
    elapsed = time.monotonic() - sent
    assert 1.0 <= elapsed < 10.0
    assert status(trial_env)["status"] == "USER_CANCELED"
    assert status(trial_env)["exit_code"] == 137
    assert_gone(child, k.pid)


def test_stop_reaches_a_grandchild_in_the_group(trial_env):
    k = keeper(["sh", "-c", "sleep 600 & echo ready $$ $!; wait"], trial_env, "--grace", "30")
    child, grandchild = numbers_after(k.expect(b"ready"), b"ready")
    k.signal(signal.SIGTERM)
    assert k.wait(timeout=20) == 128 + signal.SIGTERM  # well inside the grace: both obeyed
    assert_gone(child, grandchild)


@pytest.mark.parametrize("straggler", ["obeys SIGTERM", "ignores SIGTERM"])
def test_stragglers_in_the_group_are_stopped_when_the_child_exits(trial_env, straggler):
    ignore = "trap '' TERM; " if straggler == "ignores SIGTERM" else ""
    k = keeper(["sh", "-c", f"{ignore}sleep 600 & echo ready $!; exit 3"], trial_env)
    grandchild = numbers_after(k.expect(b"ready"), b"ready")[0]
    assert k.wait(timeout=20) == 3  # the trial's code, whatever happened to its stragglers
    assert_gone(grandchild)
    assert status(trial_env)["status"] == "FAILED"


@pytest.mark.parametrize("straggler", ["obeys SIGTERM", "ignores SIGTERM"])
def test_grandchild_that_left_the_group_is_stopped_when_the_child_exits(trial_env, straggler):
    # Popen returns once the grandchild has exec'd, so setsid has happened by
    # the time the line is printed; the child then exits and the grandchild is
    # orphaned to the keeper, a subreaper.
    ignore = straggler == "ignores SIGTERM"
    k = keeper(py(f"""
        import os, signal, subprocess
        def setup():
            if {ignore}:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True, preexec_fn=setup)
        print("ready", grandchild.pid, os.getpgid(grandchild.pid), flush=True)
    """), trial_env)
    grandchild, group = numbers_after(k.expect(b"ready"), b"ready")
    assert group == grandchild  # it did leave the group
    assert k.wait(timeout=20) == 0
    assert_gone(grandchild)


def test_second_sigterm_does_not_restart_the_grace_clock(trial_env):
    grace = 3.0
    k = keeper(py(f"""
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("term", flush=True))
        print("ready", flush=True)
        {STOP_WAITS_FOR}
    """), trial_env, "--grace", str(grace))
    k.expect(b"ready")
    first = time.monotonic()
    k.signal(signal.SIGTERM)
    k.expect(b"term")
    # The second SIGTERM comes late in the grace: were the clock restarted,
    # the kill would come `grace` after it, i.e. at least 2 s later than due.
    time.sleep(max(0.0, first + grace - 1.0 - time.monotonic()))
    k.signal(signal.SIGTERM)
    k.expect(b"term")  # forwarded again
    assert k.wait() == 137
    elapsed = time.monotonic() - first
    assert grace - 0.05 <= elapsed < grace + 1.5


@pytest.mark.parametrize("on_term", ["ignore", "exit"])
def test_a_trial_killed_after_its_grace_says_so_in_its_reason_and_one_line(trial_env, on_term):
    k = keeper(py(f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN if "{on_term}" == "ignore" else lambda *_: sys.exit(1))
        print("ready", flush=True)
        while True: time.sleep(60)
    """), {**trial_env, "TRIALKIT_GRACE_SECONDS": "0.5"})
    k.expect(b"ready")
    k.signal(signal.SIGTERM)
    assert k.wait() == (137 if on_term == "ignore" else 1)
    said = [line for line in k.stderr.decode().splitlines() if "killed: " in line]
    ended = status(trial_env)
    assert ended["status"] == "USER_CANCELED", ended
    if on_term == "ignore":
        reason = "killed: it was still running 0.5 s after SIGTERM (TRIALKIT_GRACE_SECONDS)"
        assert ended["reason"] == reason and said == [f"[trialkit-keeper] {reason}"], (ended, said)
    else:
        assert ended["reason"] == "" and said == [], (ended, said)


def test_sigint_is_forwarded_and_stops_the_trial(trial_env):
    k = keeper(py("""
        import os, signal, time
        def on_int(*_):
            print("got SIGINT", flush=True)
            os._exit(7)
        signal.signal(signal.SIGINT, on_int)
        print("ready", flush=True)
        while True: time.sleep(60)
    """), trial_env, "--grace", "30")
    k.expect(b"ready")
    k.signal(signal.SIGINT)
    k.expect(b"got SIGINT")
    assert k.wait(timeout=20) == 7  # the trial's own answer, long before the grace
    assert status(trial_env)["status"] == "USER_CANCELED"
    assert (trial_dir(trial_env) / ".trialkit" / "stop").exists()  # should_preempt() turned true


@pytest.mark.parametrize("made_ahead", [True, False])
def test_the_stop_file_is_there_when_the_handler_runs_whether_made_ahead_or_not(trial_env, made_ahead):
    # The keeper makes the stop file's inode at its start and renames it into place when a stop is asked
    # (one syscall on the way from SIGTERM to the handler); one that could not be made is created then.
    home = trial_dir(trial_env) / ".trialkit"
    k = keeper(py(f"""
        import os, signal, time
        def on_term(*_):
            print("stop file", os.path.exists({str(home / "stop")!r}), flush=True)
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        while True: time.sleep(60)
    """), trial_env)
    k.expect(b"ready")
    ready = home / ".stop.ready"
    assert ready.read_bytes() == b""
    if made_ahead:
        ready.write_text("made ahead")  # tells the renamed file from a new one (ext4 reuses inode numbers)
    else:
        ready.unlink()
    k.signal(signal.SIGTERM)
    k.expect(b"stop file True")
    assert k.wait(timeout=20) == 0
    assert not ready.exists()
    assert (home / "stop").read_text() == ("made ahead" if made_ahead else "")


def test_sigterm_racing_the_childs_own_exit(trial_env):
    # The child exits on its own within a few milliseconds of its line; the
    # SIGTERM lands before, during or after that exit. Whatever the order, the
    # keeper must neither hang (the grace is 30 s) nor leave anything.
    # Both orders are fine, and which one happens depends on the machine; but each run's code, status and
    # output must tell the same story: 0 only when the trial got to its end.
    for delay_ms in range(0, 12):
        k = keeper(py(f"""
            import time
            print("ready", flush=True)
            time.sleep({delay_ms / 4000})
            print("done", flush=True)
        """), trial_env, "--grace", "30")
        k.expect(b"ready")
        k.signal(signal.SIGTERM)
        code = k.wait(timeout=20)
        assert b"Traceback" not in k.stderr
        told = (code, status(trial_env)["status"], status(trial_env)["exit_code"])
        if code == 0:
            assert told == (0, "SUCCEEDED", 0) and k.stdout.endswith(b"done\n"), (told, k.stdout)
        else:
            assert told == (143, "USER_CANCELED", 143), (told, k.stderr)


def test_100mb_through_a_slow_reader_never_blocks_the_child(trial_env):
    size = 100 << 20
    k = subprocess.Popen([*KEEPER, "--", *py(f"""
        import sys, time
        started = time.monotonic()
        block = bytes(range(256)) * 4096
        for _ in range({size} // len(block)):
            sys.stdout.buffer.write(block)
        sys.stdout.flush()
        print("wrote in", time.monotonic() - started, file=sys.stderr, flush=True)
    """)], env=trial_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    echoed = bytearray()

    def slow_reader() -> None:  # about 3 MB/s: 100 MB would take half a minute
        while True:
            chunk = k.stdout.read1(1 << 16)
            if not chunk:
                return
            echoed.extend(chunk)
            time.sleep(0.02)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    try:
        err = k.stderr.read()  # ends when the keeper exits
        assert k.wait(timeout=60) == 0
    finally:
        reader.join(60)
        k.stdout.close()
        k.stderr.close()
    child_seconds = float(err.split(b"wrote in", 1)[1].split()[0])
    assert child_seconds < 15  # the slow reader would have held it 30 s
    log = trial_dir(trial_env) / "stdout.log"
    assert log.stat().st_size == size
    expected = hashlib.sha256(bytes(range(256)) * (size // 256)).hexdigest()
    assert hashlib.sha256(log.read_bytes()).hexdigest() == expected
    assert 0 < len(echoed) < size + 4096  # what was echoed was bounded, the file has it all


def test_child_closing_stdout_early_keeps_running(trial_env):
    k = keeper(py("""
        import os, signal, sys
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # kept for sigwait
        os.close(1)
        print("stdout closed", file=sys.stderr, flush=True)
        signal.sigwait([signal.SIGUSR1])
        print("still here", file=sys.stderr, flush=True)
        sys.exit(5)
    """), trial_env)
    k.expect(b"stdout closed", "stderr")
    assert k.proc.poll() is None
    assert status(trial_env)["status"] == "RUNNING"
    k.signal(signal.SIGUSR1)
    assert k.wait(timeout=20) == 5
    assert b"still here" in k.stderr
    assert b"still here" in (trial_dir(trial_env) / "stderr.log").read_bytes()


def _launch_error_lines(k: Proc) -> list:
    """The keeper's stderr, less the reporter's note about undelivered records."""
    assert b"Traceback" not in k.stderr
    return [line for line in k.stderr.splitlines() if b"records were not sent" not in line]


def test_command_not_found_exits_127_with_one_line(trial_env):
    k = keeper(["no-such-command-anywhere", "--flag"], trial_env)
    assert k.wait() == 127
    assert _launch_error_lines(k) == [b"trialkit-keeper: no-such-command-anywhere: command not found"]
    assert status(trial_env)["status"] == "FAILED"
    assert status(trial_env)["exit_code"] == 127


def test_not_executable_exits_126_with_one_line(trial_env, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    k = keeper([str(script)], trial_env)
    assert k.wait() == 126
    [line] = _launch_error_lines(k)
    assert str(script).encode() in line and b"not executable" in line
    assert status(trial_env)["exit_code"] == 126


def test_sigkilled_keeper_takes_its_child_along(trial_env):
    k = keeper(["sh", "-c", "echo ready $$; exec sleep 600"], trial_env)
    child = numbers_after(k.expect(b"ready"), b"ready")[0]
    k.signal(signal.SIGKILL)
    assert k.wait() == -signal.SIGKILL
    assert_gone(child)  # the parent-death signal


def _pid_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


ORPHANS = """
    import os, sys, time
    keeper = os.getppid()
    r, w = os.pipe()
    for _ in range(20):
        middle = os.fork()
        if middle == 0:
            parent = os.getpid()  # read before the fork: the middle may be gone before its child runs
            if os.fork() == 0:
                # The orphan-to-be: once its parent is gone, say who adopted it, and exit.
                while os.getppid() == parent:
                    time.sleep(0.001)
                os.write(w, b"%d %d\\n" % (os.getpid(), os.getppid()))
                os._exit(0)
            os._exit(0)
        os.waitpid(middle, 0)
    os.close(w)
    reports = b""
    while chunk := os.read(r, 4096):  # EOF: every orphan has exited
        reports += chunk
    orphans = [[int(n) for n in line.split()] for line in reports.splitlines()]
    deadline = time.monotonic() + 20
    def zombies():
        return [pid for pid, _ in orphans if os.path.exists(f"/proc/{pid}")]
    while zombies() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("keeper", keeper, "adopters", *sorted({adopter for _, adopter in orphans}), flush=True)
    print("unreaped", *zombies(), flush=True)
"""


@pytest.mark.parametrize("role", ["pid 1", "subreaper"])
def test_orphans_are_reaped(trial_env, role):
    prefix = []
    if role == "pid 1":
        if not _pid_namespaces_work():
            pytest.skip("this kernel refuses `unshare --pid --fork --mount-proc`; the subreaper case ran")
        prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    k = Proc([*prefix, *KEEPER, "--", *py(ORPHANS)], trial_env)
    assert k.wait() == 0, k.stderr
    keeper_line = k.expect(b"keeper")
    keeper_pid, adopters = numbers_after(keeper_line, b"keeper")[0], numbers_after(keeper_line, b"adopters")
    assert adopters == [keeper_pid]  # every orphan went to the keeper...
    if role == "pid 1":
        assert keeper_pid == 1
    assert numbers_after(k.expect(b"unreaped"), b"unreaped") == []  # ...which reaped them all


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1, signal.SIGHUP])
def test_death_by_signal_exits_128_plus_n(trial_env, signum):
    k = keeper(["sh", "-c", f"kill -{signum.name[3:]} $$"], trial_env)
    assert k.wait() == 128 + signum
    assert status(trial_env)["status"] == "FAILED"


BOTH_SAY_WHAT_THEY_GET = """
    import os, signal, subprocess, sys, time
    role = sys.argv[1]
    def say(*words):  # one write: two processes share the pipe
        os.write(1, (" ".join(words) + "\\n").encode())
    def note(signum, _):
        say(role, "got", signal.Signals(signum).name)
    for s in (signal.SIGUSR1, signal.SIGHUP):
        signal.signal(s, note)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if role == "child":
        grandchild = subprocess.Popen([sys.executable, sys.argv[0], "grandchild"])  # same group
    say(role, "ready")
    while True: time.sleep(60)
"""


def test_other_signals_reach_the_whole_group(trial_env, tmp_path):
    script = tmp_path / "both.py"
    script.write_text(textwrap.dedent(BOTH_SAY_WHAT_THEY_GET))
    k = keeper([PYTHON, str(script), "child"], trial_env, "--grace", "30")
    k.expect(b"child ready")
    k.expect(b"grandchild ready")
    for signum in (signal.SIGUSR1, signal.SIGHUP):
        k.signal(signum)
        got = {k.expect(b"got " + signum.name.encode()).split()[0] for _ in range(2)}
        assert got == {b"child", b"grandchild"}
    k.signal(signal.SIGTERM)
    assert k.wait(timeout=20) == 0


@pytest.mark.parametrize("trial, stopped, expected", [
    ("checkpoints and exits 143", True, "PREEMPTED"),
    ("dies of SIGTERM", True, "USER_CANCELED"),
    ("exits 143 unasked", False, "FAILED"),
])
def test_exit_143_is_preempted_only_after_a_forwarded_sigterm(trial_env, trial, stopped, expected):
    handler = {
        "checkpoints and exits 143": "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))",
        "dies of SIGTERM": "",
        "exits 143 unasked": "sys.exit(143)",
    }[trial]
    k = keeper(py(f"""
        import signal, sys, time
        {handler}
        print("ready", flush=True)
        {STOP_WAITS_FOR}
    """), trial_env, "--grace", "30")
    if stopped:
        k.expect(b"ready")
        k.signal(signal.SIGTERM)
    assert k.wait(timeout=20) == 143
    assert status(trial_env)["status"] == expected
    assert status(trial_env)["exit_code"] == 143


def test_keeper_twice_on_one_trial_dir_raises_restart_count(trial_env):
    show = ["sh", "-c", "echo counts $TRIALKIT_RESTART_COUNT $ADAPTDL_NUM_RESTARTS"]
    for expected in (0, 1, 2):
        k = keeper(show, trial_env)
        assert numbers_after(k.expect(b"counts"), b"counts") == [expected, expected]
        assert k.wait() == 0
        assert status(trial_env)["restart_count"] == expected
        assert not (trial_dir(trial_env) / ".trialkit" / "keeper.pid").exists()  # gone with its keeper
    # The platform's own count wins when it is ahead.
    k = keeper(show, {**trial_env, "TRIALKIT_RESTART_COUNT": "7"})
    assert numbers_after(k.expect(b"counts"), b"counts") == [7, 7]
    assert k.wait() == 0


def _bad_inputs(tmp_path):
    """(name, environment changes, keeper options, what the one line names) for issue 29, item 9."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return [
        ("trial dir is a file", {"TRIALKIT_TRIAL_DIR": str(a_file)}, [], "TRIALKIT_TRIAL_DIR"),
        ("trial dir under a file", {"TRIALKIT_TRIAL_DIR": str(a_file / "trial")}, [], "TRIALKIT_TRIAL_DIR"),
        ("trial dir under /proc", {"TRIALKIT_TRIAL_DIR": "/proc/trialkit-trial"}, [], "TRIALKIT_TRIAL_DIR"),
        ("trial dir too long", {"TRIALKIT_TRIAL_DIR": str(tmp_path / ("d" * 5000))}, [], "TRIALKIT_TRIAL_DIR"),
        ("malformed manager URL", {"TRIALKIT_MANAGER_URL": "http://127.0.0.1:99999"}, [], "TRIALKIT_MANAGER_URL"),
        ("manager URL of no http", {"TRIALKIT_MANAGER_URL": "ftp://example"}, [], "TRIALKIT_MANAGER_URL"),
        ("parameters file a FIFO", {"TRIALKIT_PARAMETERS_FILE": str(fifo)}, [], "TRIALKIT_PARAMETERS_FILE"),
        ("parameters file /dev/zero", {"TRIALKIT_PARAMETERS_FILE": "/dev/zero"}, [], "TRIALKIT_PARAMETERS_FILE"),
        ("parameters a JSON list", {"TRIALKIT_PARAMETERS": "[1, 2]"}, [], "TRIALKIT_PARAMETERS"),
        ("stop file under a file", {"TRIALKIT_STOP_FILE": str(a_file / "stop")}, [], "TRIALKIT_STOP_FILE"),
        ("stop file a dir", {"TRIALKIT_STOP_FILE": str(tmp_path)}, [], "TRIALKIT_STOP_FILE"),  # unlink() raised
        ("stop file name too long", {"TRIALKIT_STOP_FILE": str(tmp_path / ("s" * 5000))}, [], "TRIALKIT_STOP_FILE"),
        ("token with CRLF", {"TRIALKIT_TOKEN": "abc\r\nX-Injected: 1"}, [], "TRIALKIT_TOKEN"),
        ("grace past a week", {}, ["--grace", "1e9"], "--grace"),
        ("grace infinite", {}, ["--grace", "inf"], "--grace"),
    ]


def test_bad_input_is_one_line_and_exit_2_before_the_trial_starts(trial_env, tmp_path):
    marker = tmp_path / "ran"
    for name, changes, options, names in _bad_inputs(tmp_path):
        env = {**trial_env, **changes}
        done = subprocess.run([*KEEPER, *options, "--", PYTHON, "-c", f"open({str(marker)!r}, 'w')"], env=env,
                              capture_output=True, text=True, timeout=60)
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1 and names in lines[0], (name, done.stderr)
        assert "Traceback" not in done.stderr and not marker.exists(), name


def test_a_stop_file_in_a_missing_dir_is_made_and_a_stop_still_works(trial_env, tmp_path):
    """The stop file's dir is made at the start; SIGTERM then stops the trial as always (it crashed the keeper)."""
    stop = tmp_path / "missing" / "deeper" / "stop"
    env = {**trial_env, "TRIALKIT_STOP_FILE": str(stop)}
    proc = keeper(py(f"""
        import signal, time, trialkit
        signal.signal(signal.SIGTERM, lambda *_: None)  # a trial that checkpoints at its next step
        print("ready", flush=True)
        while not trialkit.should_preempt():
            time.sleep(0.02)
        print("preempted", flush=True)
    """), env, "--grace", "5")
    proc.expect(b"ready")
    proc.signal(signal.SIGTERM)
    proc.expect(b"preempted")
    assert proc.wait() == 0 and stop.exists()
    assert b"Traceback" not in proc.stderr and b"warning" not in proc.stderr, proc.stderr


def test_a_grace_past_a_week_in_the_environment_is_bounded_with_a_line_and_a_stop_still_works(trial_env):
    """Issue 29, item 6: 3,000,000 s (34 days) overflowed the loop's timer at the first stop (OverflowError)."""
    k = keeper(py("""
        import time
        print("ready", flush=True)
        time.sleep(60)
    """), {**trial_env, "TRIALKIT_GRACE_SECONDS": "3000000"})
    k.expect(b"ready")
    k.signal(signal.SIGTERM)
    assert k.wait(timeout=30) == 143
    assert b"Traceback" not in k.stderr
    assert k.stderr.count(b"ignoring TRIALKIT_GRACE_SECONDS='3000000': outside 0..604800 seconds; using 604800") == 1


def test_an_experiments_grace_past_a_week_is_refused_with_one_line(tmp_path):
    """The control plane's kill timer (grace + flush) raised OverflowError in its thread past ~24.8 days."""
    from trialkit.control.config import parse_config
    from trialkit.errors import UserError

    config = {"trialCommand": "true", "trialConcurrency": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
              "tuner": {"name": "Random"}, "trainingService": {"platform": "local"}}
    assert parse_config({**config, "trialGraceSeconds": 604800}, tmp_path).trial_grace_seconds == 604800
    for grace in (604801, 3_000_000, 10 ** 300):
        with pytest.raises(UserError) as refused:
            parse_config({**config, "trialGraceSeconds": grace}, tmp_path)
        assert "trialGraceSeconds" in refused.value.line() and "604800" in refused.value.line()
