"""What the keeper, wrap_rank and a trial's SDK load before their first useful step.

Their start-up is mostly imports (bench/bench_keeper.py races it against
`python -c pass`). Modules that cost milliseconds and are not needed on that
path must stay off it: dataclasses (which imports inspect), ast, shutil (with
zlib, bz2, lzma), typing (1.6 ms: annotations are strings, its names are
imported for type checkers only), AdaptDL's wiring (it brings its checkpoint
hook's module), and http.client (with ssl and email): the keeper's shipper has
its own HTTP, and ssl only for an https manager.
The keeper starts its command before it loads its reporting side. Each check
runs in a fresh interpreter and names what pulled the module in.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from trialkit import layout, process
from trialkit.control.admin import ManagerInfo, write_info
from trialkit.manager import paths
from trialkit.manager.store import Store
from web_util import fill

HEAVY = ("dataclasses", "inspect", "ast", "http.client", "ssl", "shutil", "typing", "trialkit.adaptdl")
# What the keeper loads once its command runs (spool, decoders, followed files, threads).
REPORTING_SIDE = ("trialkit.keeper.keep", "trialkit.keeper.reporter", "trialkit.keeper.collector",
                  "trialkit.keeper.spool", "trialkit.keeper.logs")

PROBE = """
import builtins, json, sys
loaded_by = {}
real_import = builtins.__import__
def tracing_import(name, globals=None, locals=None, fromlist=(), level=0):
    before = set(sys.modules)
    try:
        return real_import(name, globals, locals, fromlist, level)
    finally:
        for new in set(sys.modules) - before:
            loaded_by.setdefault(new, (globals or {}).get("__name__", "?"))
builtins.__import__ = tracing_import
exec(sys.argv[1])
print(json.dumps({m: loaded_by.get(m, "?") for m in sys.argv[2:] if m in sys.modules}))
"""


@pytest.mark.parametrize("what, code", [
    ("the keeper", "import trialkit.keeper.main"),
    # argparse's help formatter, made while arguments are added, imports shutil for the terminal's width.
    ("the keeper's arguments", "import trialkit.keeper.main as m; m.parse_args(['--grace', '5', '--', 'true'])"),
    ("wrap_rank", "import trialkit.launch.wrap_rank"),
    ("a trial's SDK", "import trialkit; trialkit.get_next_parameter(); trialkit.report_intermediate_result(1)"),
])
def test_start_path_leaves_heavy_modules_out(what, code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRIALKIT_TRIAL_DIR=str(tmp_path))
    for name in ("TRIALKIT_MANAGER_URL", "NNI_PLATFORM"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", PROBE, code, *HEAVY], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {}, f"{what} loads {loaded} (module: imported by)"


def test_the_keeper_starts_its_command_before_loading_its_reporting_side(tmp_path):
    code = (
        "import trialkit.keeper.main as m\n"
        "real_spawn = m.spawn\n"
        "at_spawn = []\n"
        "def spawn(*args, **kwargs):\n"
        "    at_spawn.extend(sys.modules)\n"
        "    return real_spawn(*args, **kwargs)\n"
        "m.spawn = spawn\n"
        "assert m.run(['--quiet', '--', 'true']) == 0\n"
        "assert at_spawn\n"
        "for name in list(sys.modules):\n"
        "    if name not in at_spawn:\n"
        "        del sys.modules[name]\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRIALKIT_TRIAL_DIR=str(tmp_path))
    env.pop("TRIALKIT_MANAGER_URL", None)
    done = subprocess.run([sys.executable, "-c", PROBE, code, *HEAVY, *REPORTING_SIDE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {}, f"the keeper loads {loaded} (module: imported by) before its command starts"
    assert json.loads((tmp_path / ".trialkit" / "status.json").read_text())["status"] == "SUCCEEDED"


def test_a_keeper_that_ships_to_a_plain_http_manager_loads_no_http_client_ssl_email_or_typing(tmp_path):
    # Its reporting side loads beside the starting trial, on the CPU the trial starts on: http.client (with
    # email and ssl) was most of it (keeper/shipper.py), typing most of the rest. No manager answers here: the
    # keeper tries, and ends.
    code = "import trialkit.keeper.main as m\nassert m.run(['--quiet', '--flush-seconds', '0.3', '--', 'true']) == 0"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRIALKIT_TRIAL_DIR=str(tmp_path), TRIALKIT_TRIAL_ID="t1",
               TRIALKIT_TOKEN="token-1", TRIALKIT_MANAGER_URL="http://127.0.0.1:9")
    done = subprocess.run([sys.executable, "-c", PROBE, code, "http.client", "ssl", "email", "typing",
                           "trialkit.keeper.shipper"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"trialkit.keeper.shipper": "trialkit.keeper.reporter"}, loaded


# What the commands that only read the store leave to the commands that talk to a manager.
MANAGER_SIDE = ("trialkit.control.admin", "trialkit.control.actions", "trialkit.control.background",
                "trialkit.platforms.local", "trialkit.manager.server", "http.client", "ssl", "psutil")
# ... and what reading the store does without (a few milliseconds each).
NOT_FOR_READING = ("dataclasses", "inspect", "subprocess", "socket", "secrets", "hashlib", "csv")


def test_trial_list_as_a_command_leaves_the_manager_side_out(tmp_path):
    # Users and scripts run `trialkit trial list` while an experiment runs; its
    # start-up is most of its answer time (bench/bench_ray_many.py).
    code = "import trialkit.cli\ntry:\n    trialkit.cli.main(['trial', 'list', 'nosuch'])\nexcept SystemExit:\n    pass"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRIALKIT_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", PROBE, code, *MANAGER_SIDE, *NOT_FOR_READING], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert "no experiment 'nosuch'" in done.stderr, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {}, f"trial list loads {loaded} (module: imported by)"


# What no command that only reads may load: an HTTP server, an engine, a plotting or tuning library, the control
# loop or the action table (they were 1.1 of 1.25 s of `experiment list`: aiohttp through background -> admin ->
# actions -> manager/server).
SERVER_AND_ENGINES = ("aiohttp", "trialkit.manager.server", "trialkit.control.actions", "trialkit.control.loop",
                      "trialkit.platforms.local", "trialkit.web.routes", "trialkit.web.manager_page",
                      "trialkit.web.ui", "torch", "numpy", "optuna", "matplotlib", "plotly",
                      "ray", "kubernetes", "deepspeed", "horovod", "adaptdl", "psutil", "http.client", "ssl")
RUNS, ENDED = "runs0001", "ended001"  # an experiment whose manager runs (this test's process stands for it), one not


@pytest.fixture
def stored_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    for experiment_id in (RUNS, ENDED):
        experiment_dir = home / "experiments" / experiment_id
        store = Store.in_dir(experiment_dir)
        fill(store, experiment_id, trials=3, steps=4, running=1)
        store.close()
        log = paths.trial_dir(experiment_dir, f"{experiment_id}-00001") / paths.TRIAL_LOG
        log.parent.mkdir(parents=True)
        log.write_text("epoch 1 of the trial\n")
    me = os.getpid()
    write_info(home / "experiments" / RUNS, ManagerInfo(RUNS, me, process.start_ticks(me), "http://127.0.0.1:1", 1, "t"))
    return home


# (the command, what its output shows when it did its work)
READING = [
    (["experiment", "list"], RUNS),
    (["experiment", "show", ENDED], "best"),
    (["experiment", "show", RUNS], "page        http://127.0.0.1:1/?token="),  # the address, from the page's face
    (["trial", "list", RUNS], f"{RUNS}-00002"),
    (["trial", "show", f"{RUNS}-00001"], "history:"),
    (["trial", "logs", f"{ENDED}-00001"], "epoch 1 of the trial"),
    (["job", "list"], f"{RUNS}-00002"),
    (["--help"], "experiment"),
]
# What one of them needs that the others do not: the page's token is an HMAC of the manager's.
NEEDS = {("experiment", "show", RUNS): ("hashlib",)}


@pytest.mark.parametrize("argv, says", READING, ids=[" ".join(argv) for argv, _ in READING])
def test_commands_that_read_load_no_server_and_no_engine(argv, says, stored_home):
    code = f"import trialkit.cli\ntry:\n    trialkit.cli.main({argv!r})\nexcept SystemExit:\n    pass"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRIALKIT_HOME=str(stored_home))
    barred = [name for name in (*SERVER_AND_ENGINES, *NOT_FOR_READING) if name not in NEEDS.get(tuple(argv), ())]
    done = subprocess.run([sys.executable, "-c", PROBE, code, *barred], env=env, cwd=stored_home,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and says in done.stdout, (done.stdout, done.stderr)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {}, f"{' '.join(argv)} loads {loaded} (module: imported by)"


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_names_the_engines_installed_and_imports_none(option, tmp_path):
    import trialkit
    from trialkit.cli import ENGINES

    code = f"import trialkit.cli\ntry:\n    trialkit.cli.main([{option!r}])\nexcept SystemExit as done:\n    assert not done.code"
    done = subprocess.run([sys.executable, "-c", PROBE, code, *ENGINES], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *printed, loaded = done.stdout.strip().splitlines()
    assert json.loads(loaded) == {}, f"{option} imports {loaded}"
    assert printed[0].startswith(f"trialkit {trialkit.__version__} (Python ")
    assert [line.split() for line in printed[1:]] == [[name, *_installed(name)] for name in ENGINES]


def _installed(name: str) -> list:
    from importlib import metadata

    try:
        return [metadata.version(name)]
    except metadata.PackageNotFoundError:
        return ["not", "installed"]
