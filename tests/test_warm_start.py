"""Warm start on the local platform (trainingService.warmStart; keeper/zygote.py, keeper/warm.py), with real
`trialkit run`s: a trial started warm is still its own process (the keeper's child, in its own session), with
its own parameters and its own draws, stopped by SIGTERM, failing as a cold one fails; what is not eligible
starts cold; and no process is left, the zygote included (conftest's check), a killed run's keepers aside.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List

import psutil
import pytest

from experiment_util import RESUMABLE, cli, experiment, export, paused_and_activated, sigkilled_while_running, \
    start_cli
from harness import wait_until

pytestmark = pytest.mark.usefixtures("home")

ZYGOTE = "trialkit.keeper.zygote"
# Each trial writes what it is to facts.json in its trial dir: whether its keeper was forked by the zygote, whether
# it was itself forked (its command line the zygote's) or exec'd, its parameters, an unseeded draw of numpy's.
FACTS = """
import json, os, sys
numpy_preloaded = "numpy" in sys.modules  # a new interpreter has not imported it yet
import numpy
import numpy.random  # numpy 2 loads it on first use: imported at the top, the zygote preloads it, seeded once
import trialkit

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read()

facts = {"keeper_warm": "%s" in cmdline(os.getppid()), "forked": "%s" in cmdline("self"),
         "sid": os.getsid(0) == os.getpid(), "argv": sys.argv, "path0": sys.path[0], "main": __name__,
         "numpy_preloaded": numpy_preloaded}
""" % (ZYGOTE, ZYGOTE)


def warm_experiment(tmp_path: Path, space: Dict, script: str, warm: bool = True, **keys) -> Path:
    return experiment(tmp_path, space, FACTS + script, name="warm" if warm else "cold",
                      trainingService={"platform": "local", "warmStart": warm}, **keys)


def facts(home: Path, exp: str) -> Dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text())
            for path in (home / "experiments" / exp / "trials").glob("*/facts.json")}


def ran(config: Path, code: int = 0) -> str:
    done = cli("run", config)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout.split()[2]  # started experiment ID


def test_warm_trials_get_their_own_parameters_and_draw_their_own_numbers(tmp_path, home):
    space = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}
    script = """
p = trialkit.get_next_parameter()
facts.update(x=p["x"], draw=float(numpy.random.rand()), environ_x=json.loads(os.environ["TRIALKIT_PARAMETERS"])["x"])
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_intermediate_result(p["x"])
trialkit.report_final_result(p["x"] * 10)
"""
    config = warm_experiment(tmp_path, space, script, tuner={"name": "GridSearch"}, maxTrialNumber=4)
    exp = ran(config)
    rows = export(exp)
    assert sorted(row["final"] for row in rows) == [10, 20, 30, 40]
    assert all(row["final"] == row["parameters"]["x"] * 10 for row in rows), rows
    seen = facts(home, exp)
    assert len(seen) == 4
    for trial, fact in seen.items():
        assert fact["keeper_warm"] and fact["forked"] and fact["numpy_preloaded"], (trial, fact)
        assert fact["sid"] and fact["main"] == "__main__" and fact["argv"] == ["trial.py"], fact
        assert fact["path0"] == str(home / "experiments" / exp / "trials" / trial / "code"), fact
        assert fact["environ_x"] == fact["x"]
    draws = [fact["draw"] for fact in seen.values()]
    assert len(set(draws)) == 4, f"unseeded numpy draws repeat between warm trials: {draws}"
    assert (home / "experiments" / exp / "warm-start.log").exists()


def test_a_warm_trials_grandchild_is_stopped_with_its_tree(tmp_path, home):
    script = """
import subprocess
child = subprocess.Popen(["sleep", "600"])
facts["grandchild"] = child.pid
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_final_result(1)
"""
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, maxTrialNumber=1)
    exp = ran(config)
    (fact,) = facts(home, exp).values()
    assert fact["forked"] and fact["sid"], fact
    assert not psutil.pid_exists(fact["grandchild"]) or \
        psutil.Process(fact["grandchild"]).status() == psutil.STATUS_ZOMBIE, "the grandchild outlived its trial"


def test_a_warm_trial_stopped_checkpoints_on_sigterm_and_resumes(tmp_path, home):
    # Pause sends the keeper SIGTERM, which stops the trial's group: the script's handler saves its step.
    script = """
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
""" + RESUMABLE
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, maxTrialNumber=1)
    exp, _ = paused_and_activated(home, [config])
    (row,) = export(exp)
    assert row["final"] == 1
    trial_dir = home / "experiments" / exp / "trials" / f"{exp}-00000"
    said = (trial_dir / "stdout.log").read_text()
    assert "checkpoint at step 10" in said and "restart 1 from step 10" in said, said
    assert json.loads((trial_dir / "facts.json").read_text())["forked"]


def _stderr(home: Path, exp: str) -> Dict[str, str]:
    """Each trial's stderr by its parameter x, its trial dir written as TRIAL."""
    out = {}
    for row in export(exp):
        trial_dir = str(home / "experiments" / exp / "trials" / row["trial_id"])
        text = (Path(trial_dir) / "stderr.log").read_text().replace(trial_dir, "TRIAL")
        out[row["parameters"]["x"]] = text
    return out


def _exit_codes(home: Path, exp: str) -> Dict[str, int]:
    out = {}
    for row in export(exp):
        status = home / "experiments" / exp / "trials" / row["trial_id"] / ".trialkit" / "status.json"
        out[row["parameters"]["x"]] = json.loads(status.read_text())["exit_code"]
    return out


def test_a_warm_trial_fails_as_a_cold_one_does_exit_codes_and_tracebacks_alike(tmp_path, home):
    script = """
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
p = trialkit.get_next_parameter()

def fail():
    raise ValueError("boom")

if p["x"] == "raise":
    fail()
if p["x"] == "exit":
    sys.exit(3)
if p["x"] == "message":
    sys.exit("bye")
if p["x"] == "interrupt":
    raise KeyboardInterrupt
"""
    space = {"x": {"_type": "choice", "_value": ["raise", "exit", "message", "interrupt"]}}
    codes, errors = {}, {}
    for warm in (True, False):
        exp = ran(warm_experiment(tmp_path, space, script, warm=warm, tuner={"name": "GridSearch"},
                                  maxTrialNumber=4), code=1)  # its trials failed
        assert {fact["forked"] for fact in facts(home, exp).values()} == {warm}
        codes[warm], errors[warm] = _exit_codes(home, exp), _stderr(home, exp)
    assert codes[True] == codes[False] == {"raise": 1, "exit": 3, "message": 1, "interrupt": 130}
    assert errors[True]["raise"] == errors[False]["raise"]
    assert re.match(r'Traceback \(most recent call last\):\n  File "TRIAL/code/trial.py", line \d+, in <module>\n',
                    errors[True]["raise"]), errors[True]["raise"]
    assert errors[True]["raise"].rstrip().endswith("ValueError: boom")
    assert errors[True]["message"] == errors[False]["message"] == "bye\n"
    assert errors[True]["interrupt"] == errors[False]["interrupt"]
    assert errors[True]["interrupt"].rstrip().endswith("KeyboardInterrupt")


def test_a_warm_trials_output_is_written_as_it_prints_it_and_kept_when_it_is_killed(tmp_path, home):
    """Unbuffered (the local platform sets PYTHONUNBUFFERED; -u too), a cold trial's print is in its log at once:
    a warm one's too, so `trial logs` follows it live and a SIGKILL (the OOM killer, a grace run out) loses none
    of it. A newcomer's warm trial showed nothing until it ended, and nothing at all once killed."""
    script = """
print("to stdout, not flushed")
print("to stderr, not flushed", file=sys.stderr)
import signal
os.kill(os.getpid(), signal.SIGKILL)
"""
    for warm in (True, False):
        for n, command in enumerate(("python3 trial.py", "python3 -u trial.py")):
            (tmp_path / str(n)).mkdir(exist_ok=True)
            exp = ran(warm_experiment(tmp_path / str(n), {"x": {"_type": "choice", "_value": [1]}}, script, warm=warm,
                                      maxTrialNumber=1, trialCommand=command), code=1)  # its trial failed
            trial = home / "experiments" / exp / "trials" / f"{exp}-00000"
            said = ((trial / "stdout.log").read_text(), (trial / "stderr.log").read_text(),
                    json.loads((trial / ".trialkit" / "status.json").read_text())["exit_code"])
            assert said == ("to stdout, not flushed\n", "to stderr, not flushed\n", 137), (warm, command, said)


# What a script sees of its interpreter: a warm trial must see what a cold one does.
INTERPRETER = """
import atexit, gc, json, os, signal, sys
import logging  # preloaded: its atexit handler (logging.shutdown) is the trial's as a cold trial's is
p = trialkit.get_next_parameter()
dir = os.environ["TRIALKIT_TRIAL_DIR"]
with open("/proc/self/status") as f:
    blocked = [line.split()[1] for line in f if line.startswith("SigBlk")]
seen = {"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
        "main_is_me": sys.modules["__main__"].__dict__ is globals(),
        "stdout": [sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering, sys.stdout.write_through,
                   sys.stdout.fileno()],
        "stderr": [sys.stderr.encoding, sys.stderr.errors, sys.stderr.line_buffering, sys.stderr.fileno()],
        "stdin": [sys.stdin.fileno(), sys.stdin.read()],
        "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "handlers": {s.name: str(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP,
                                                               signal.SIGUSR1, signal.SIGPIPE, signal.SIGQUIT)},
        "wakeup_fd": signal.set_wakeup_fd(-1), "blocked": blocked, "atexit": atexit._ncallbacks(),
        "gc": gc.isenabled(), "open_fds": sorted(os.listdir("/proc/self/fd")),
        "session": os.getsid(0) == os.getpid(),
        "parent_is_keeper": os.environ["TRIALKIT_KEEPER_PID"] == str(os.getppid()),
        "forked": facts["forked"]}
with open(os.path.join(dir, "seen.json"), "w") as f:
    json.dump(seen, f)
atexit.register(lambda: print("atexit ran", flush=True))
print("unflushed at exit", end="")
"""


def test_a_warm_trial_sees_the_interpreter_a_cold_one_sees(tmp_path, home):
    # -u and PYTHONIOENCODING reach the streams; everything else as a new interpreter's (its trial dir aside).
    seen = {}
    for warm in (True, False):
        config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}},
                            FACTS + INTERPRETER, name="warm" if warm else "cold",
                            maxTrialNumber=1, trialCommand="python3 -u trial.py a 'b c'",
                            trainingService={"platform": "local", "warmStart": warm})
        environ = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}  # -u says it
        done = cli("run", config, env={**environ, "PYTHONIOENCODING": "latin-1:replace"})
        assert done.returncode == 0, done.stdout + done.stderr
        exp = done.stdout.split()[2]
        trial_dir = home / "experiments" / exp / "trials" / f"{exp}-00000"
        seen[warm] = json.loads((trial_dir / "seen.json").read_text().replace(str(trial_dir), "TRIAL"))
        assert seen[warm].pop("forked") is warm
        assert (trial_dir / "stdout.log").read_text().endswith("unflushed at exitatexit ran\n")
    assert seen[True] == seen[False]
    assert seen[True]["argv"] == ["trial.py", "a", "b c"] and seen[True]["file"] == "TRIAL/code/trial.py"
    assert seen[True]["stdout"] == ["iso8859-1", "replace", False, True, 1]
    assert seen[True]["open_fds"] == ["0", "1", "2", "3"]  # and listdir's own
    assert seen[True]["atexit"] == 1


# Standard library only: the system's own Python (the venv's binary, another site-packages) runs it too.
STDLIB_FACTS = """
import json, os

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read()

facts = {"keeper_warm": "%s" in cmdline(os.getppid()), "forked": "%s" in cmdline("self")}
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
""" % (ZYGOTE, ZYGOTE)


NOT_ELIGIBLE = "its command is not `python3 SCRIPT.py ...` or `python3 -m MODULE ...` (-u allowed) run by trialkit's " \
               "own Python (OWN)"
OTHER_PYTHON = "its Python (WHERE) is not trialkit's own (OWN): activate trialkit's environment before `trialkit run`, " \
               "or name trialkit's Python in trialCommand"


@pytest.mark.parametrize("command,why", [
    ("python3 -B trial.py", NOT_ELIGIBLE), ("sh -c 'python3 trial.py'", NOT_ELIGIBLE),
    ("REAL trial.py", OTHER_PYTHON.replace("WHERE", "REAL")),
    # The python3 first on the trial's PATH another one (newcomer21: trialkit called by its path, its venv not
    # activated, read "its command is not `python3 SCRIPT.py ...`" of exactly that command).
    ("python3 trial.py", OTHER_PYTHON.replace("WHERE", "python3 on the trial's PATH: REAL"))])
def test_an_ineligible_command_starts_cold(tmp_path, home, command, why):
    # REAL: python3 outside the venv that is the venv's very binary: one file with it, but not the same Python
    # (another sys.prefix, other site-packages).
    other = tmp_path / "other" / "python3"
    other.parent.mkdir()
    other.symlink_to(os.path.realpath(sys.executable))
    command = command.replace("REAL", str(other))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, STDLIB_FACTS, maxTrialNumber=2,
                        trialCommand=command, trainingService={"platform": "local", "warmStart": True},
                        trialConcurrency=1, tuner={"name": "GridSearch"})
    path = os.pathsep.join([str(other.parent), os.environ["PATH"]]) if command.startswith("python3 trial") \
        else os.environ["PATH"]
    done = cli("run", config, env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stdout + done.stderr
    exp = done.stdout.split()[2]
    # warmStart is parsed and not applied to these trials: the run says so, once, with why.
    told = [line for line in done.stderr.splitlines() if "warmStart" in line]
    why = why.replace("REAL", str(other)).replace("OWN", sys.executable)
    assert told == [f"trialkit: warmStart: trial {exp}-00000 starts cold: {why}"], told
    fact = facts(home, exp)[f"{exp}-00000"]
    assert fact == {"keeper_warm": False, "forked": False}
    assert not (home / "experiments" / exp / "warm-start.log").exists(), "a zygote was started for nothing"
    assert [row["status"] for row in export(exp)] == ["SUCCEEDED"] * 2


def test_a_detached_runs_user_reads_why_its_trials_start_cold_in_experiment_show(tmp_path, home):
    # Detached, the run's stderr is manager.log: `experiment show`, where its user looks, says the line too.
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, STDLIB_FACTS, maxTrialNumber=1,
                        trialCommand="python3 -B trial.py", trainingService={"platform": "local", "warmStart": True})
    started = cli("run", config, "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    exp = started.stdout.split()[2]
    wait_until(lambda: "DONE" in cli("experiment", "show", exp).stdout.splitlines()[1], 60.0, "the run to end")
    why = NOT_ELIGIBLE.replace("OWN", sys.executable)
    shown = [line for line in cli("experiment", "show", exp).stdout.splitlines() if line.startswith("warm start ")]
    assert shown == [f"warm start  trial {exp}-00000 starts cold: {why}"], shown


def test_a_module_that_starts_a_thread_at_import_is_not_preloaded_and_the_trial_still_starts_warm(tmp_path, home):
    # numpy's OpenBLAS starts its pool at import unless it may use one thread: the zygote, which must fork
    # single-threaded, starts again without numpy; the keeper and the trial's Python start warm all the same.
    script = """
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_final_result(1)
"""
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, maxTrialNumber=1,
                             trialConcurrency=1)
    done = cli("run", config, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    exp = done.stdout.split()[2]
    (fact,) = facts(home, exp).values()
    assert fact["keeper_warm"] and fact["forked"] and not fact["numpy_preloaded"], fact
    log = (home / "experiments" / exp / "warm-start.log").read_text()
    assert "zygote: numpy started a thread at import: not preloaded" in log, log


# Imported at run time, not at the script's top (which the zygote reads): what trials import so is preloaded
# once one of them ended, each module the trial's own code dir holds or that starts a thread at import aside.
LEARNED = """
def lazily():
    before = {name: name in sys.modules for name in ("colorsys", "mylib", "threadmod")}
    import colorsys, mylib, threadmod
    return before

facts["before"] = lazily()
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_final_result(trialkit.get_next_parameter()["x"])
"""


def test_what_warm_trials_import_at_run_time_is_preloaded_for_the_next_but_their_own_modules_and_threads(
        tmp_path, home):
    """numpy loads numpy.random at its first use, np.load imports zipfile: a trial that imports a module as it
    runs (colorsys here) tells the zygote as it ends, and the zygote preloads it for the trials after (trial 0 did
    not have it, trials 1 and 2 do). Never a module of the trial's code dir (mylib); never one that starts a
    thread at import (threadmod, from PYTHONPATH: the zygote would fork no more): tried in a fork first, it is
    left out, and the trials still start warm."""
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3]}}, LEARNED, maxTrialNumber=3,
                             trialConcurrency=1)
    (config.parent / "mylib.py").write_text("VALUE = 1\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "threadmod.py").write_text("import threading, time\n"
                                       "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    # The code dir on PYTHONPATH too, as a user's project may be: the zygote could import mylib, and must not.
    path = os.pathsep.join(filter(None, [str(lib), str(config.parent), os.environ.get("PYTHONPATH")]))
    done = cli("run", config, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stdout + done.stderr
    exp = done.stdout.split()[2]
    found = {trial[-1]: fact for trial, fact in facts(home, exp).items()}
    assert [found[n]["before"]["colorsys"] for n in "012"] == [False, True, True], found
    assert not any(found[n]["before"]["mylib"] or found[n]["before"]["threadmod"] for n in "012"), found
    assert all(found[n]["keeper_warm"] and found[n]["forked"] for n in "012"), found
    log = (home / "experiments" / exp / "warm-start.log").read_text()
    assert "zygote: not preloaded (a thread started at import, or it hung): threadmod\n" in log, log
    assert "more modules that trials imported" in log, log


GATED = """
import time
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
for i in range(3):
    trialkit.report_intermediate_result(i)
while not os.path.exists(%r):
    time.sleep(0.05)
trialkit.report_final_result(1)
"""


def _holds_pidfd(holder: int, pid: int) -> bool:
    """Whether process `holder` has a pidfd of process `pid` open (the local platform watches a keeper so)."""
    fdinfo = Path(f"/proc/{holder}/fdinfo")
    for entry in fdinfo.iterdir():
        try:
            if f"Pid:\t{pid}\n" in entry.read_text():
                return True
        except OSError:
            continue
    return False


def test_a_killed_run_leaves_its_warm_keepers_which_resume_reattaches_and_the_zygote_goes(tmp_path, home,
                                                                                          no_process_left):
    go = tmp_path / "go"
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, GATED % str(go),
                             maxTrialNumber=1, trialConcurrency=1)
    seen: Dict[str, int] = {}

    def keeper_and_zygote(exp: str, trial: str) -> None:
        """Before the kill: the keeper (its pidfile) and its parent, the zygote."""
        pidfile = home / "experiments" / exp / "trials" / trial / ".trialkit" / "keeper.pid"
        seen["keeper"] = int(pidfile.read_text().split()[0])
        seen["zygote"] = psutil.Process(seen["keeper"]).ppid()
        assert ZYGOTE in " ".join(psutil.Process(seen["zygote"]).cmdline()), "the keeper is not the zygote's child"

    exp, trial = sigkilled_while_running(config, home, reports=3, before_kill=keeper_and_zygote)
    trial_dir = home / "experiments" / exp / "trials" / trial
    assert json.loads((trial_dir / "facts.json").read_text())["keeper_warm"]
    keeper, zygote = seen["keeper"], seen["zygote"]
    wait_until(lambda: not psutil.pid_exists(zygote) or psutil.Process(zygote).status() == psutil.STATUS_ZOMBIE,
               30, "the zygote to go with its run")
    assert psutil.Process(keeper).is_running(), "the warm keeper died with its run"
    resume = start_cli("experiment", "resume", exp)
    try:
        wait_until(lambda: _holds_pidfd(resume.pid, keeper), 60, "the resume to reattach the keeper (its pidfd)")
        go.touch()
        out, err = resume.communicate(timeout=120)
    finally:
        if resume.poll() is None:
            resume.kill()
            resume.wait()
    assert resume.returncode == 0, out + err
    (row,) = export(exp)
    assert row["status"] == "SUCCEEDED" and row["final"] == 1
    status = json.loads((trial_dir / ".trialkit" / "status.json").read_text())
    assert status["restart_count"] == 0, "the trial was started again rather than reattached"


def test_a_warm_keeper_killed_ends_its_trial_as_a_cold_ones_does_its_exit_code_known(tmp_path, home):
    # The trial SIGKILLs its own keeper: no final status is written, so the platform tells the end by the keeper's
    # exit code, which only its parent can reap: the zygote, for a warm keeper.
    script = """
import signal, time
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_intermediate_result(1)
status = os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], ".trialkit", "status.json")
while not (os.path.exists(status) and '"RUNNING"' in open(status).read()):  # its keeper said it runs
    time.sleep(0.01)
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(60)  # ended by its keeper's death (the parent-death signal)
"""
    reasons = {}
    for warm in (True, False):
        config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, warm=warm,
                                 maxTrialNumber=1)
        exp = ran(config, code=1)
        assert [fact["keeper_warm"] for fact in facts(home, exp).values()] == [warm]
        (row,) = export(exp)
        reasons[warm] = (row["status"], row.get("reason"), row.get("exit_code"))
    assert reasons[True] == reasons[False]
    assert "SIGKILL" in str(reasons[True]), reasons


def test_a_zygote_that_dies_turns_warm_start_off_with_one_line_and_the_trials_start_cold(tmp_path, home):
    # A module outside the code dir that the script imports, and that ends any process without a trial's identity
    # (the zygote has none) at its import: the zygote dies preloading it.
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "fragile.py").write_text("import os\nif 'TRIALKIT_TRIAL_ID' not in os.environ:\n    os._exit(3)\n")
    script = """
import fragile
with open(os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], "facts.json"), "w") as f:
    json.dump(facts, f)
trialkit.report_final_result(1)
"""
    config = warm_experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, script, maxTrialNumber=2,
                             tuner={"name": "GridSearch"})
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(lib), os.environ.get("PYTHONPATH")]))}
    done = cli("run", config, env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = done.stdout.split()[2]
    assert [fact["keeper_warm"] for fact in facts(home, exp).values()] == [False, False]
    said = [line for line in done.stderr.splitlines() if "warm start is off" in line]
    assert len(said) == 1 and "the warm process ended" in said[0], done.stderr
    assert sorted(row["final"] for row in export(exp)) == [1, 1]
