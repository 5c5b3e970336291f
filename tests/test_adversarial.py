"""Adversarial inputs from outside (issues 29 and 45): what a local process, a user's typo or a hostile request
can send, and what must come back. A bad request to the manager is counted and said in one line at most,
never a traceback; the server goes on serving. Issue 45's families are here too: the environment a launcher
meets, odd homes and stores, the keeper in a container (marker `containers`: podman) and the queue across
experiments (tests/test_pools_adversarial.py holds the rest of the queue's).
"""
from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing

import pytest

from containers_util import needs_podman, podman
from harness import child_environ, wait_until
from trialkit.control.admin import ManagerInfo, write_info
from trialkit.manager.store import Store
from trialkit.process import start_ticks
from trialkit.statuses import USER_CANCELED
from web_util import fill

PYTHON = sys.executable

# Requests aiohttp refuses before any handler runs: each printed a traceback into the experiment's terminal.
BAD_HEADS = [
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a request line past aiohttp's bound
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n",  # a header past it
    b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


@pytest.fixture
def manager(tmp_path):
    """`python -m trialkit.manager.server` on a fresh store: (its port, its process)."""
    Store.in_dir(tmp_path).close()
    proc = subprocess.Popen([PYTHON, "-m", "trialkit.manager.server", "--experiment-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def send(port: int, data: bytes) -> bytes:
    """`data` on a connection of its own; what comes back before the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def test_a_flood_of_malformed_requests_is_one_counted_line_not_tracebacks(manager):
    port, proc = manager
    for _ in range(5):
        for head in BAD_HEADS:
            assert send(port, head).split(b" ", 2)[1] == b"400", head[:40]
    answer = send(port, b"GET /api/v1/trials/t/parameters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]  # still serving
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    err = proc.stderr.read()
    assert "Traceback" not in err, err[:3000]
    said = [line for line in err.splitlines() if "bad request" in line]
    assert len(said) == 1 and "1 bad request(s) refused so far" in said[0], err[:3000]
    assert err.count("\n") == 1, err[:3000]


# ---------------------------------------------------------------- the command line

LONG_ID = "x" * 5000
KUBEFLOW = ("searchSpace: {lr: {_type: loguniform, _value: [0.001, 0.1]}}\n"
            "tuner: {name: Random}\n"
            "trainingService:\n"
            "  platform: kubeflow\n"
            "  managerAddress: 10.0.0.5\n"
            "  master: {replicas: 1, command: python3 train.py, image: example/train:1}\n")
LOCAL = ("searchSpace: {x: {_type: choice, _value: [1]}}\ntrialCommand: python3 -c pass\nmaxTrialNumber: 1\n"
         "tuner: {name: Random}\n")


def run_cli(home, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "trialkit.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=child_environ(TRIALKIT_HOME=str(home)))


def assert_one_line(done: subprocess.CompletedProcess, says: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert len(done.stderr) < 1000, done.stderr[:1000]  # a 5,000-character argument is not echoed whole
    assert says in done.stderr, done.stderr


def a_store_whose_config_is_not_json(home) -> str:
    store = Store.in_dir(home / "experiments" / "abc12345")
    store.create_experiment("abc12345", config={"experimentName": "n"})
    store.close()
    with closing(sqlite3.connect(home / "experiments" / "abc12345" / "trialkit.db")) as db:
        db.execute("UPDATE experiments SET config='{not json'")
        db.commit()
    return "abc12345"


# (name, the arguments (a callable of tmp_path for the ones that need files), what the one line says)
CLI_CASES = [
    ("a 5000-character experiment id", ["experiment", "show", LONG_ID], "is not an experiment id"),
    ("a 5000-character id to trial list", ["trial", "list", LONG_ID], "is not an experiment id"),
    ("a 5000-character trial id", ["trial", "show", LONG_ID + "-00001"], "is not a trial id"),
    ("a 5000-character id to ui", ["ui", LONG_ID], "is not an experiment id"),
    ("an empty id to ui", ["ui", ""], "'' is not an experiment id"),  # it served every experiment instead
    ("a 5000-character unknown argument", ["job", "list", LONG_ID], "[4,840 characters]"),
    ("a 5000-digit priority", ["job", "update", "abc12345", "--priority", "9" * 5000], "characters]..."),
    ("an experiment id that is a path", ["experiment", "export", "../../etc"], "is not an experiment id"),
    ("a store whose config is not JSON",
     lambda tmp: ["experiment", "show", a_store_whose_config_is_not_json(tmp / "home")], "config is not JSON"),
    ("a config that is /dev/zero", ["run", "/dev/zero"], "/dev/zero: it is not a regular file"),
    ("a config that is a FIFO", lambda tmp: ["run", fifo(tmp / "config.yml")], "config.yml: it is not a regular file"),
    ("a search space file that is a FIFO",
     lambda tmp: ["run", write(tmp / "c.yml", LOCAL.replace("searchSpace: {x: {_type: choice, _value: [1]}}",
                                                             f"searchSpaceFile: {fifo(tmp / 'space.json')}"))],
     "searchSpaceFile: "),
    ("render a trial far past any run", lambda tmp: ["render", write(tmp / "k.yml", KUBEFLOW), "--trial", "1000000000"],
     "--trial: trial 1000000000 is past what render proposes"),
    ("render a trial past maxTrialNumber",
     lambda tmp: ["render", write(tmp / "k.yml", KUBEFLOW + "maxTrialNumber: 3\n"), "--trial", "3"], "pick a number below 3"),
]


def fifo(path):
    os.mkfifo(path)  # no writer: reading it would wait for ever
    return path


def write(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.parametrize("name, args, says", CLI_CASES, ids=[case[0] for case in CLI_CASES])
def test_cli_misuse_is_one_line(tmp_path, name, args, says):
    args = args(tmp_path) if callable(args) else args
    assert_one_line(run_cli(tmp_path / "home", *args, cwd=tmp_path), says)


def test_the_hidden_experiment_id_of_run_cannot_name_a_path(tmp_path):
    config = write(tmp_path / "c.yml", LOCAL)
    home = tmp_path / "deep" / "home"
    done = run_cli(home, "run", config, "--experiment-id", "../../escaped")
    assert_one_line(done, "--experiment-id: '../../escaped' is not an experiment id")
    assert not (tmp_path / "deep" / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_plot_writes_the_name_given_and_only_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    home = tmp_path / "home"
    fill(Store.in_dir(home / "experiments" / "abc12345"), "abc12345", trials=3, steps=2)
    done = run_cli(home, "experiment", "plot", "abc12345", "-o", tmp_path / "plot")
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "plot"), done.stderr
    assert (tmp_path / "plot").read_bytes().startswith(b"\x89PNG") and not (tmp_path / "plot.png").exists()
    assert_one_line(run_cli(home, "experiment", "plot", "abc12345", "-o", tmp_path / "out.jpg"),
                    "-o: the plot is a PNG, not '.jpg' (name it out.png)")
    assert not (tmp_path / "out.jpg").exists()
    # is_dir() raised ENAMETOOLONG before the write's own catch: a traceback, exit 1
    assert_one_line(run_cli(home, "experiment", "plot", "abc12345", "-o", "a" * 300 + ".png", cwd=tmp_path),
                    "File name too long")


class _NotJson(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>a proxy's page</html>")

    def log_message(self, *args) -> None:
        pass


def test_an_answer_that_is_not_the_managers_is_one_line(tmp_path):
    """manager.json names a live process (this one) whose port answers HTML: the admin client says so."""
    home = tmp_path / "home"
    Store.in_dir(home / "experiments" / "abc12345").create_experiment("abc12345", config={})
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotJson)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        info = ManagerInfo("abc12345", os.getpid(), start_ticks(os.getpid()), f"http://127.0.0.1:{port}", port, "tok")
        write_info(home / "experiments" / "abc12345", info)
        done = run_cli(home, "experiment", "pause", "abc12345")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert_one_line(done, "is not the manager's (not JSON: b\"<html>a proxy")


# ---------------------------------------------------------------- odd homes and stores

def _a_store(home, config=None) -> "Path":
    """An experiment abc12345 with one trial, its config as given (trialkit's own shape by default)."""
    experiment_dir = home / "experiments" / "abc12345"
    store = Store.in_dir(experiment_dir)
    store.create_experiment("abc12345", config={"experimentName": "n", "tuner": {"name": "Random", "classArgs": {
        "optimize_mode": "minimize"}}, "trainingService": {"platform": "local"}} if config is None else config)
    store.add_trial("abc12345", "abc12345-00000", sequence=0, parameters={"x": 1}, token="t",
                    trial_dir=str(experiment_dir / "trials" / "abc12345-00000"))
    store.close()
    (experiment_dir / "trials" / "abc12345-00000").mkdir(parents=True)
    return experiment_dir


def _fifo_in_place_of(path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


# What a home may hold that trialkit did not write: each read bounded, a FIFO never opened (each hung for ever).
ODD_HOMES = {
    "a store that is a FIFO": lambda home: _fifo_in_place_of(_a_store(home) / "trialkit.db"),
    "a store's WAL that is a FIFO": lambda home: _fifo_in_place_of(_a_store(home) / "trialkit.db-wal"),
    "manager.json that is a FIFO": lambda home: _fifo_in_place_of(_a_store(home) / "manager.json"),
    "a trial's gpus.json that is a FIFO":
        lambda home: _fifo_in_place_of(_a_store(home) / "trials" / "abc12345-00000" / "gpus.json"),
    "a trial's gpu_samples.jsonl that is a FIFO":
        lambda home: _fifo_in_place_of(_a_store(home) / "trials" / "abc12345-00000" / "gpu_samples.jsonl"),
    "a config without a tuner": lambda home: _a_store(home, {"experimentName": "n"}),  # KeyError: 'tuner'
    "a config whose tuner is a string": lambda home: _a_store(home, {"tuner": "Random", "trainingService": 3}),
    "a config that is a list": lambda home: _a_store(home, [1, 2]),  # AttributeError from experiment list
}
READERS = [["experiment", "list"], ["experiment", "show", "abc12345"], ["trial", "list", "abc12345"],
           ["trial", "show", "abc12345-00000"], ["experiment", "export", "abc12345"]]


@pytest.mark.parametrize("odd", list(ODD_HOMES))
def test_every_reader_of_an_odd_home_answers_at_once_without_a_traceback(tmp_path, odd):
    home = tmp_path / "home"
    ODD_HOMES[odd](home)
    for args in READERS:
        try:
            done = subprocess.run([PYTHON, "-m", "trialkit.cli", *args], capture_output=True, text=True, timeout=30,
                                  env=child_environ(TRIALKIT_HOME=str(home)))
        except subprocess.TimeoutExpired:
            pytest.fail(f"`trialkit {' '.join(args)}` hangs on {odd}")
        assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        if done.returncode != 0:
            assert_one_line(done, "abc12345")


def test_experiment_show_of_a_config_without_a_tuner_shows_what_there_is(tmp_path):
    _a_store(tmp_path / "home", {"experimentName": "n"})
    done = run_cli(tmp_path / "home", "experiment", "show", "abc12345")
    assert done.returncode == 0, done.stderr
    assert "tuner       - (maximize)" in done.stdout and "platform    -" in done.stdout, done.stdout


def test_experiment_list_names_each_odd_store_and_lists_the_others(tmp_path):
    home = tmp_path / "home"
    _fifo_in_place_of(_a_store(home) / "trialkit.db")
    good = Store.in_dir(home / "experiments" / "good1234")
    good.create_experiment("good1234", config={"experimentName": "fine"})
    good.close()
    done = run_cli(home, "experiment", "list")
    assert done.returncode == 0, done.stderr
    (odd,) = [line for line in done.stdout.splitlines() if line.startswith("abc12345")]
    assert "DAMAGED" in odd and "is not a regular file" in odd, done.stdout
    assert any(line.startswith("good1234") and "fine" in line for line in done.stdout.splitlines()), done.stdout


# ---------------------------------------------------------------- launchers

TRIALS = ("import trialkit\n\n\nclass Fine(trialkit.Trial):\n    def run(self):\n        pass\n\n\n"
          "class Plain:\n    def run(self):\n        pass\n\n\ndef function():\n    pass\n\n\nVALUE = 3\n")
LAUNCH_CASES = [
    ("a class that is no Trial", ["--trial", "trials.py:Plain"], "trials.py:Plain is a class that subclasses nothing"),
    ("a function", ["--trial", "trials.py:function"], "trials.py:function is a function, not a trialkit.Trial"),
    ("a value", ["--trial", "trials:VALUE"], "trials:VALUE is a value, not a trialkit.Trial"),
]
OVERRIDES = [
    (["--no-such-option", "1"], "refused the overrides --no-such-option 1: "),
    (["--nproc_per_node", "abc"], "refused the overrides --nproc_per_node abc: "),
]


@pytest.mark.parametrize("name, args, says", LAUNCH_CASES, ids=[case[0] for case in LAUNCH_CASES])
def test_a_trial_class_that_is_no_trial_is_refused_before_the_engine(tmp_path, name, args, says):
    (tmp_path / "trials.py").write_text(TRIALS)
    done = subprocess.run([PYTHON, "-m", "trialkit.launch.torch_distributed", *args], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=child_environ())
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("overrides, says", OVERRIDES, ids=["unknown option", "bad value"])
def test_bad_overrides_are_one_line_and_exit_2_without_the_engines_traceback(tmp_path, overrides, says):
    """torchrun refuses them (argparse's usage, or a traceback of its own): that goes to its log, kept and named."""
    pytest.importorskip("torch")
    (tmp_path / "script.py").write_text("print('ran')\n")
    done = subprocess.run([PYTHON, "-m", "trialkit.launch.torch_distributed", *overrides, "--", "script.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=child_environ())
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr and "ran" not in done.stdout, done.stderr
    log = done.stderr.rsplit("(its output: ", 1)[1].rstrip(")\n")
    try:
        assert "usage:" in open(log).read() or "Traceback" in open(log).read()
    finally:
        os.unlink(log)


def test_a_failed_worker_is_one_line_without_the_engines_traceback(tmp_path):
    pytest.importorskip("torch")
    # Rank 1 fails once rank 0 has printed (a gate): else it may fail first and rank 0 be stopped before its line.
    (tmp_path / "fail.py").write_text(
        "import os, pathlib, sys, time\nprint('rank', os.environ['RANK'], flush=True)\ngate = pathlib.Path('printed')\n"
        "if os.environ['RANK'] == '0':\n    gate.touch()\n    sys.exit(0)\n"
        "deadline = time.monotonic() + 60\nwhile not gate.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\nsys.exit(3)\n")
    done = subprocess.run([PYTHON, "-m", "trialkit.launch.torch_distributed", "fail.py"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=child_environ(TRIALKIT_SLOTS_PER_NODE="2"))
    assert done.returncode == 3, done.stderr
    # One line; "; stopped the other workers" too when rank 0 had not ended yet.
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("trialkit.launch.torch_distributed: rank 1 failed with exit code 3 running fail.py")
    assert sorted(done.stdout.splitlines()) == ["[rank=0] rank 0", "[rank=1] rank 1"]


# The environment a launcher meets: each a line naming the variable, exit 2, no worker started.
DIGITS = "9" * 5000
ENV_CASES = [
    ("no slots", "trialkit.launch.torch_distributed", [], {"TRIALKIT_SLOTS_PER_NODE": "0"},
     "TRIALKIT_SLOTS_PER_NODE: 1 nodes x 0 slots is no worker at all"),  # it ran one worker, exit 0
    ("no slots under autohorovod", "determined.launch.autohorovod", [], {"TRIALKIT_SLOTS_PER_NODE": "0"},
     "TRIALKIT_SLOTS_PER_NODE: 1 nodes x 0 slots is no worker at all"),
    ("slots that are no number under autohorovod", "determined.launch.autohorovod", [],
     {"TRIALKIT_SLOTS_PER_NODE": "abc"}, "TRIALKIT_SLOTS_PER_NODE='abc' is not a whole number"),  # a traceback
    ("5000-digit slots", "trialkit.launch.deepspeed", [], {"TRIALKIT_SLOTS_PER_NODE": DIGITS}, "characters]"),
    ("a rank variable that is no rank", "trialkit.launch.wrap_rank", ["RANK,HOROVOD_RANK"],
     {"RANK": "abc", "HOROVOD_RANK": "1"}, "RANK='abc' is not a rank"),
    ("a 5000-digit rank variable", "trialkit.launch.wrap_rank", ["RANK,HOROVOD_RANK"], {"RANK": DIGITS},
     "(5,000 characters) is not a rank"),  # a ValueError traceback (Python's int-string limit)
    ("a 5000-digit rank", "trialkit.launch.wrap_rank", [DIGITS], {}, "(5,000 characters) is not a rank"),
]


@pytest.mark.parametrize("name, module, args, environ, says", ENV_CASES, ids=[case[0] for case in ENV_CASES])
def test_an_environment_no_launcher_can_run_is_one_line(tmp_path, name, module, args, environ, says):
    from trialkit import env

    shims = {"PYTHONPATH": os.pathsep.join([str(env.SHIMS_BOOT_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([PYTHON, "-m", module, *args, "--", PYTHON, "-c", "print('ran')"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=child_environ(**shims, **environ))
    assert_one_line(done, says)
    assert "ran" not in done.stdout


def test_a_rank_that_is_no_rank_is_said_once_under_the_keeper(tmp_path):
    """The keeper has no use for RANK: it said 'ignoring RANK=...; using 0' and then wrap_rank refused it."""
    done = subprocess.run([PYTHON, "-m", "trialkit.keeper", "--trial-dir", str(tmp_path / "trial"), "--",
                           PYTHON, "-m", "trialkit.launch.wrap_rank", "RANK,HOROVOD_RANK", "--", PYTHON, "-c", "pass"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=child_environ(RANK="abc", HOROVOD_RANK="1", TRIALKIT_SLOTS_PER_NODE="abc"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["trialkit.launch.wrap_rank: error: RANK: RANK='abc' is not a rank (ranks are "
                                        "whole numbers from 0, each below the job's worker count)"], done.stderr


# ---------------------------------------------------------------- configs every trial of which failed to start

@pytest.mark.parametrize("holds", ["nothing", "a dangling symlink"])
def test_a_code_dir_with_no_file_to_copy_still_runs_its_trials(tmp_path, holds):
    """The local platform copies the code dir into each trial's: an empty copy is still a dir to start in."""
    code = tmp_path / "code"
    code.mkdir()
    if holds == "a dangling symlink":
        (code / "data").symlink_to(tmp_path / "gone")
    config = write(tmp_path / "c.yml", LOCAL + f"trialCodeDirectory: {code}\n")
    done = run_cli(tmp_path / "home", "run", config)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"[a-z0-9]{8}-\d{5} ", line)]  # the trials table
    assert rows and all("SUCCEEDED" in row for row in rows), done.stdout[-2000:]


def test_a_ray_address_nobody_answers_is_one_line_before_any_trial(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as sock:  # a port of this machine that nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write(tmp_path / "c.yml", LOCAL.replace("maxTrialNumber: 1", "maxTrialNumber: 3")
                   + f"trainingService: {{platform: ray, address: '127.0.0.1:{port}'}}\n")
    done = run_cli(tmp_path / "home", "run", config)
    assert_one_line(done, f"trainingService.address: cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert "trial" not in done.stdout, done.stdout  # found before the first trial, not once per trial


def test_a_token_with_a_byte_past_ascii_is_401_not_500(manager):
    """aiohttp reads header bytes past ASCII as surrogates, which no hash takes: the request was a 500."""
    port, proc = manager
    answer = send(port, b"GET /api/v1/trials/t/parameters HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Bearer \xe9t\xff\r\nConnection: close\r\n\r\n")
    assert answer.split(b" ", 2)[1] == b"401", answer[:200]


def test_a_launcher_under_a_long_tmpdir_still_links_its_workers(tmp_path):
    """The workers' socket lives under TMPDIR; past a socket path's 107 bytes it was an OSError traceback."""
    pytest.importorskip("torch")
    tmpdir = tmp_path / ("d" * 150)
    tmpdir.mkdir()
    (tmp_path / "script.py").write_text("import os\nprint('ran', os.environ['RANK'])\n")
    done = subprocess.run([PYTHON, "-m", "trialkit.launch.torch_distributed", "script.py"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=child_environ(TMPDIR=str(tmpdir)))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stdout == "[rank=0] ran 0\n"


def _holds_itself():
    loop = {"_type": "choice"}
    loop["_value"] = [loop]
    return loop


def _nested_tuples():
    deep = ()
    for _ in range(100_000):
        deep = (deep,)
    return deep


@pytest.mark.parametrize("key, value", [("search_space", _holds_itself()), ("search_space", _nested_tuples()),
                                        ("tuner", _holds_itself())], ids=["loop", "deep tuples", "tuner loop"])
def test_a_program_s_config_value_that_holds_itself_or_nests_without_bound_is_a_user_error(key, value):
    """Experiment.config took any Python value and copied it before the config checks: a RecursionError."""
    from trialkit.errors import UserError
    from trialkit.experiment import Experiment

    config = Experiment("local").config
    setattr(config, key, value)
    with pytest.raises(UserError) as err:
        config.validate()
    assert err.value.where == "Experiment.config" and "\n" not in str(err.value), str(err.value)


def test_a_priority_out_of_range_is_said_by_its_size_not_its_digits():
    from trialkit.control.queue import Move
    from trialkit.errors import UserError

    with pytest.raises(UserError) as err:
        Move("t", priority=10 ** 5000)
    assert "out of range" in str(err.value) and len(str(err.value)) < 300, str(err.value)[:300]


def test_a_body_with_a_number_past_python_s_digits_is_400_without_interpreter_advice():
    """int()'s own message advises sys.set_int_max_str_digits: advice for a programmer, not a user."""
    from trialkit.manager.server import HttpError, Request

    request = Request("POST", "/", {}, {}, b'{"priority": ' + b"9" * 5000 + b"}")
    with pytest.raises(HttpError) as err:
        request.json()
    assert err.value.status == 400 and "5,000 digits" in err.value.reason, err.value.reason
    assert "sys." not in err.value.reason, err.value.reason


class _Count(int):
    pass


@pytest.mark.parametrize("metric", [10 ** 5000, -(10 ** 5000), {10 ** 5000: 1.0}, {"default": 1.0, "n": _Count(10 ** 5000)}],
                         ids=["value", "negative", "key", "int subclass"])
def test_a_metric_whole_number_past_python_s_digits_is_refused_in_words_for_a_user(metric):
    """The SDK said int()'s own message, which advises sys.set_int_max_str_digits (a setting, not the user's fix)."""
    from trialkit import records

    with pytest.raises(records.BadRecord) as err:
        records.plain_metric(metric)
    assert "more than 4,300 digits" in str(err.value) and "sys." not in str(err.value), str(err.value)


# ---------------------------------------------------------------- the keeper in a container (marker `containers`)
# What a trial image meets under podman, the keeper as PID 1 (tests/test_containers.py holds the contract).

CONTAINER_TRIAL_DIR = "/var/lib/trialkit/trial"
TOKEN = "tok-" + "c0nta1ner" * 5


def _shared_dir(path):
    path.mkdir()
    path.chmod(0o777)  # whatever uid the container runs as
    return path


@pytest.mark.containers
@needs_podman
def test_no_environment_printed_in_a_container_holds_the_token(containers, image, tmp_path):
    home = _shared_dir(tmp_path / "trial")
    container = containers.start(image, "-v", f"{home}:{CONTAINER_TRIAL_DIR}", env={"TRIALKIT_TOKEN": TOKEN},
                                 command=["sh", "-c", "env; cat /proc/1/environ; echo; ps eww 1 2>&1; echo dumped"])
    assert containers.wait(container) == 0, containers.logs(container)
    logs = containers.logs(container)
    assert "dumped" in logs and "TRIALKIT_TRIAL_DIR=" in logs, logs
    assert TOKEN not in logs and TOKEN not in (home / "stdout.log").read_text(), logs


@pytest.mark.containers
@needs_podman
def test_podman_stop_ends_a_hanging_startup_hook_within_the_trials_grace(containers, image, tmp_path):
    """run.sh as PID 1 sourced the hook: a shell as PID 1 ignores SIGTERM, so podman waited its 10 s, SIGKILLed
    the container and no status was ever written. The keeper is PID 1 now and the hook runs under it."""
    home = _shared_dir(tmp_path / "trial")
    code = _shared_dir(tmp_path / "code")
    (code / "startup-hook.sh").write_text(f"touch {CONTAINER_TRIAL_DIR}/hooked\nsleep 300 &\nwait\n")
    container = containers.start(image, "-v", f"{home}:{CONTAINER_TRIAL_DIR}", "-v", f"{code}:/code:ro",
                                 env={"TRIALKIT_CODE_DIR": "/code", "TRIALKIT_GRACE_SECONDS": "2"},
                                 command=["python3", "-c", "print('the trial ran')"])
    wait_until(lambda: (home / "hooked").exists(), 60, "the hook to start")
    began = time.monotonic()
    podman("stop", container)  # podman's own 10 s
    assert containers.wait(container) == 143
    assert time.monotonic() - began < 8
    final = json.loads((home / ".trialkit" / "status.json").read_text())
    assert final["status"] == USER_CANCELED, final
    assert "the trial ran" not in containers.logs(container)


# ---------------------------------------------------------------- the queue across experiments

QUEUED_TRIAL = """
import os, time, trialkit
trialkit.get_next_parameter()
while not os.path.exists({gate!r}):
    time.sleep(0.05)
trialkit.report_final_result(1.0)
"""


def test_two_experiments_on_one_slot_outlive_a_pools_yml_broken_under_them(tmp_path):
    """A holds the pool's only slot, B waits for it; pools.yml gets a key twice while both run. The commands
    that read it say so in one line; the running control planes go on with the pool they opened (no
    traceback in their logs), B starts when A's slot frees, and both end DONE."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "pools.yml").write_text("pools:\n  default: {slots: 1}\n")
    ids = []
    for name in ("a", "b"):
        config = experiment_config(tmp_path, name, QUEUED_TRIAL.format(gate=str(tmp_path / f"gate-{name}")))
        done = run_cli(home, "run", config, "--detach")
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.splitlines()[0].split()[-1])
        wait_until(lambda: f"{ids[-1]}-00000" in run_cli(home, "trial", "list", ids[-1]).stdout, 60,
                   f"experiment {name}'s trial")
    a, b = ids
    wait_until(lambda: "waiting for 1 slot" in run_cli(home, "trial", "list", b).stdout, 60, "B to wait")
    (home / "pools.yml").write_text("pools:\n  default: {slots: 1}\n  default: {slots: 2}\n")
    assert_one_line(run_cli(home, "job", "list", "--pool"), "the key 'default' is given twice")
    (tmp_path / "gate-a").touch()
    wait_until(lambda: "RUNNING" in run_cli(home, "trial", "list", b).stdout, 60, "B to take the freed slot")
    (tmp_path / "gate-b").touch()
    wait_until(lambda: run_cli(home, "experiment", "list").stdout.count("DONE") == 2, 60, "both to end")
    for experiment in (a, b):
        log = (home / "experiments" / experiment / "manager.log").read_text()
        assert "Traceback" not in log, log[-3000:]


def experiment_config(tmp_path, name: str, script: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "trial.py").write_text(script)
    (folder / "config.yml").write_text(
        "searchSpace: {x: {_type: choice, _value: [1]}}\ntrialCommand: python3 trial.py\ntrialCodeDirectory: .\n"
        "trialConcurrency: 1\nmaxTrialNumber: 1\ntuner: {name: Random}\ntrainingService: {platform: local}\n")
    return folder / "config.yml"
