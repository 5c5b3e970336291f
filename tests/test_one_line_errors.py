"""Bad inputs get one line and exit 2, never a traceback (issue 16, points 7 and 8).

Each case is run as a user runs it: the `trialkit` command or a launcher,
in a fresh TRIALKIT_HOME. What a user sees is asserted: the exit status,
one line on stderr naming what was wrong, no "Traceback".
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from harness import child_environ
from trialkit.errors import UserError
from trialkit.manager.store import Store

PYTHON = sys.executable
TIMEOUT = 60.0
BASE = {"searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "trialCommand": "python3 -c pass",
        "trialConcurrency": 1, "maxTrialNumber": 1,
        "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local"}}


def config_text(**keys) -> str:
    return yaml.safe_dump({**BASE, **keys}, sort_keys=False)


def deep_space(levels: int) -> str:
    return config_text().replace(
        "searchSpace:\n  x:\n    _type: choice\n    _value:\n    - 1\n    - 2\n",
        'searchSpace: {"x": ' + '{"_type": "choice", "_value": [' * levels + "1" + "]}" * levels + "}\n")


def billion_laughs() -> str:
    lines = ["searchSpace:", "  x:", "    _type: choice", "    _value:", '      - &a ["x","x","x","x","x","x","x","x","x","x"]']
    for name, previous in zip("bcdefghi", "abcdefgh"):
        lines.append(f"      - &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
    rest = yaml.safe_dump({k: v for k, v in BASE.items() if k != "searchSpace"}, sort_keys=False)
    return "\n".join(lines) + "\n" + rest


def space_text(space: str) -> str:
    """The base config with its search space written as YAML text (for anchors and aliases)."""
    rest = yaml.safe_dump({k: v for k, v in BASE.items() if k != "searchSpace"}, sort_keys=False)
    return space + "\n" + rest


def alias_chain(links: int) -> str:
    """Each option an alias of the one before, wrapped once more: shallow as written, deep once read."""
    lines = ["searchSpace:", "  x:", "    _type: choice", "    _value:", "      - &a0 [1]"]
    lines += [f"      - &a{i} [*a{i - 1}]" for i in range(1, links)]
    return space_text("\n".join(lines))


BIG = "1" + "0" * 400  # past a float's range
# (name, the config's text, what the one line names)
RUN_CASES = [
    ("a search space that holds itself", space_text("searchSpace: &s\n  x: {_type: choice, _value: [1, *s]}"),
     "the alias *s is inside the value &s names"),
    ("a nested option that holds itself",
     space_text("searchSpace:\n  x: &n {_type: choice, _value: [{_name: a, y: *n}]}"), "the alias *n is inside"),
    ("aliases chained 1500 deep", alias_chain(1500), "nested deeper than 100"),
    ("a whole number of 5000 digits", config_text() + "maxTrialDuration: " + "9" * 5000 + "\n",
     "a whole number of 5,000 digits"),
    ("a JSON config with a number of 5000 digits",
     '{"maxTrialNumber": ' + "9" * 5000 + ', "trialCommand": "python3 -c pass"}', "a whole number of 5,000 digits"),
    ("a duration of 400 digits", config_text() + f"maxTrialDuration: {BIG}\n", "maxTrialDuration: a whole number"),
    ("a duration of 400 digits with a unit", config_text() + f"maxExperimentDuration: {BIG}h\n",
     "maxExperimentDuration: duration"),
    ("a bound of 400 digits", space_text(f"searchSpace: {{x: {{_type: uniform, _value: [0, {BIG}]}}}}"),
     "searchSpace.x._value[1]"),
    ("a q of 400 digits", space_text(f"searchSpace: {{x: {{_type: quniform, _value: [0, 1, {BIG}]}}}}"),
     "searchSpace.x._value[2]"),
    ("a concurrency of 400 digits", config_text(trialConcurrency=int(BIG)), "trialConcurrency: a whole number"),
    ("parameters too large for a trial's environment",
     config_text(searchSpace={"x": {"_type": "choice", "_value": ["a" * 150_000]}}),
     "searchSpace: a trial's parameters could take 150,"),
    ("a trial command too long for a trial's environment", config_text(trialCommand="python3 -c pass #" + "x" * 140_000),
     "trialCommand: the command is 140,017 bytes"),
    ("a NUL in the trial command", config_text(trialCommand="python3 -c pass\x00"),
     "trialCommand: 'python3 -c pass\\x00' holds a NUL character"),
    ("a lone surrogate in the trial command", json.dumps({**BASE, "trialCommand": "python3 \ud800"}),
     "trialCommand: 'python3 \\ud800' holds '\\ud800', half of a UTF-16 pair"),
    ("a working dir of 5000 characters", config_text(experimentWorkingDirectory="/tmp/" + "w" * 5000),
     "experimentWorkingDirectory: the path has a part of 5000 bytes"),
    ("a working dir 6000 bytes long", config_text(experimentWorkingDirectory="/tmp/" + "/".join(["w" * 200] * 30)),
     "experimentWorkingDirectory: the path is"),
    ("working dir under /dev/null", config_text(experimentWorkingDirectory="/dev/null/x"), "experimentWorkingDirectory"),
    ("working dir under /sys", config_text(experimentWorkingDirectory="/sys/x"), "experimentWorkingDirectory"),
    ("working dir under /proc", config_text(experimentWorkingDirectory="/proc/x"), "experimentWorkingDirectory"),
    ("code dir /proc/self", config_text(trialCodeDirectory="/proc/self"), "trialCodeDirectory"),
    ("search space nested 3000 deep", deep_space(3000), "nested deeper than 100"),
    ("aliases of aliases in _value", billion_laughs(), "expands to more than"),
    ("a key given twice", config_text() + "trialConcurrency: 2\n", "'trialConcurrency' is given twice (first at line"),
    ("an empty config file", "", "config.yml: the config file is empty (write at least trialCommand, searchSpace"),
    ("a config of comments alone", "# to do\n", "config.yml: the config file is empty (write at least trialCommand"),
]


def assert_one_line(done: subprocess.CompletedProcess, names: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert names in done.stderr, done.stderr


@pytest.mark.parametrize("name, text, names", RUN_CASES, ids=[case[0] for case in RUN_CASES])
def test_a_bad_config_is_one_line(tmp_path, name, text, names):
    code = tmp_path / "code"  # the experiments live outside the code dir (TRIALKIT_HOME)
    code.mkdir()
    (code / "config.yml").write_text(text)
    done = subprocess.run([PYTHON, "-m", "trialkit.cli", "run", str(code / "config.yml")], capture_output=True,
                          text=True, timeout=TIMEOUT, env=child_environ(TRIALKIT_HOME=str(tmp_path / "home")))
    assert_one_line(done, names)


TRIAL_FILE = "import trialkit\n\n\nclass Fine(trialkit.Trial):\n    def run(self):\n        pass\n"
LAUNCH_CASES = [
    ("--trial names no module", ["--trial", "no_such_module_here:Fine"], {}, "no module named no_such_module_here"),
    ("--trial names no class in a module", ["--trial", "fine_trial:Missing"], {}, "fine_trial has no class Missing"),
    ("--trial names no class in a file", ["--trial", "fine_trial.py:Missing"], {}, "has no class Missing"),
    ("chief port out of range", ["script.py"], {"TRIALKIT_CHIEF_PORT": "99999"}, "TRIALKIT_CHIEF_PORT"),
    ("chief address not of this node", ["script.py"], {"TRIALKIT_CHIEF_ADDR": "no.such.host.invalid"},
     "TRIALKIT_CHIEF_ADDR"),
    ("PET_NNODES not a number", ["script.py"], {"PET_NNODES": "1:x"}, "PET_NNODES"),
    ("more workers than a machine runs", ["script.py"], {"TRIALKIT_SLOTS_PER_NODE": "99999999999999999999"},
     "slots is more than any machine runs"),
]


@pytest.mark.parametrize("engine", ["torch_distributed", "deepspeed"])
@pytest.mark.parametrize("name, args, environ, names", LAUNCH_CASES, ids=[case[0] for case in LAUNCH_CASES])
def test_a_bad_launch_is_one_line_before_any_engine_starts(tmp_path, engine, name, args, environ, names):
    (tmp_path / "fine_trial.py").write_text(TRIAL_FILE)
    (tmp_path / "script.py").write_text("print('ran')\n")
    done = subprocess.run([PYTHON, "-m", f"trialkit.launch.{engine}", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=tmp_path, env=child_environ(**environ))
    assert_one_line(done, names)
    assert "ran" not in done.stdout


def test_a_chief_on_ipv6_loopback_runs(tmp_path):
    (tmp_path / "script.py").write_text("print('ran')\n")
    done = subprocess.run([PYTHON, "-m", "trialkit.launch.torch_distributed", "script.py"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=child_environ(TRIALKIT_CHIEF_ADDR="::1"))
    assert done.returncode == 0, done.stderr
    assert "ran" in done.stdout and "Traceback" not in done.stderr


# ---------------------------------------------------------------- stored experiments

@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    for experiment_id in ("good1", "good2"):
        store = Store.in_dir(home / "experiments" / experiment_id)
        store.create_experiment(experiment_id, config={"experimentName": f"name-{experiment_id}"})
        store.close()
    bad = home / "experiments" / "bad1"
    bad.mkdir(parents=True)
    (bad / "trialkit.db").write_bytes(os.urandom(8192))  # garbage where the store should be
    return home


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "trialkit.cli", *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env=child_environ(TRIALKIT_HOME=str(home)))


def test_a_damaged_store_is_one_line_of_the_list_and_the_others_still_list(home):
    done = cli(home, "experiment", "list")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[2:]}
    assert set(lines) == {"bad1", "good1", "good2"}
    assert "DAMAGED (trialkit.db: file is not a database)" in lines["bad1"]
    assert "name-good1" in lines["good1"] and "name-good2" in lines["good2"]
    assert_one_line(cli(home, "experiment", "show", "bad1"), "its store is damaged")


def test_plot_into_a_directory_writes_inside_it(home, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    out.mkdir()
    done = cli(home, "experiment", "plot", "good1", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "good1.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "plots.png").exists()


def test_trialkit_ui_on_a_host_name_that_does_not_resolve_is_one_line(home):
    assert_one_line(cli(home, "ui", "--host", "no.such.host.invalid"), "--host")


def test_trialkit_ui_serves_on_ipv6_loopback(home):
    proc = subprocess.Popen([PYTHON, "-m", "trialkit.cli", "ui", "good1", "--host", "::1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_environ(TRIALKIT_HOME=str(home)))
    try:
        url = proc.stdout.readline().split()[-1]
        assert url.startswith("http://[::1]:"), (url, proc.stderr.read() if proc.poll() is not None else "")
        base, token = url.split("/?token=")
        token = token.split("#")[0]
        listed = requests.get(f"{base}/api/ui/experiments", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert [e["id"] for e in listed.json()] == ["good1"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


ENGINE_CASES = [("kubernetes", "examples/kubernetes/kubeflow-pytorch.yml", "kubeflow"),
                ("ray", None, "ray")]


@pytest.mark.parametrize("engine, example, platform", ENGINE_CASES, ids=[case[0] for case in ENGINE_CASES])
def test_a_platform_whose_engine_is_not_installed_names_the_extra(tmp_path, engine, example, platform):
    # The demo installs neither the cluster's client nor Ray: a user's first Kubernetes or Ray config must say so.
    root = Path(__file__).resolve().parent.parent
    if example is None:
        config = tmp_path / "ray.yml"
        config.write_text(config_text(trainingService={"platform": "ray", "address": "127.0.0.1:6379"}))
    else:
        config = root / example
    hidden = f"import sys; sys.modules[{engine!r}] = None; from trialkit.cli import main; main()"
    done = subprocess.run([PYTHON, "-c", hidden, "run", str(config)], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=root, env=child_environ(TRIALKIT_HOME=str(tmp_path / "home")))
    assert_one_line(done, f"the {platform} platform needs the {engine!r} package")
    assert f"pip install 'trialkit[{engine}]'" in done.stderr
    assert not (tmp_path / "home" / "experiments").exists() or not any((tmp_path / "home" / "experiments").iterdir())


@pytest.mark.parametrize("job_id, says", [("good1", "good1 is an experiment"),
                                          ("good1-00000", "trial good1-00000 has none")])
def test_a_priority_that_is_no_number_where_no_kueue_job_is_says_not_a_whole_number(home, job_id, says):
    done = cli(home, "job", "update", job_id, "--priority", "abc")
    assert_one_line(done, "--priority abc: not a whole number (a priority is a whole number from -")
    assert says in done.stderr and done.stderr.count("(") == 1, done.stderr


PACKAGE = Path(__file__).resolve().parent.parent / "trialkit"
# Modules whose fixes others mend this session (polish6's brief): a follow-up once theirs are merged.
NESTED_FIXES_LEFT: tuple = ()
PLAIN_FIX_MODULES = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                           if "UserError(" in path.read_text()
                           and not str(path.relative_to(PACKAGE)).startswith(NESTED_FIXES_LEFT))


def fix_texts(fix, names: dict, seen: frozenset = frozenset()) -> list:
    """The strings a fix is made of: its constants, and those of the module's names it uses (`names`: each
    module-level name's value), through the names those use."""
    import ast

    texts = []
    for node in ast.walk(fix):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        elif isinstance(node, ast.Name) and node.id in names and node.id not in seen:
            texts += fix_texts(names[node.id], names, seen | {node.id})
    return texts


def test_the_plain_fix_check_reads_every_module_with_user_errors():
    assert "cli.py" in PLAIN_FIX_MODULES and "platforms/pools.py" in PLAIN_FIX_MODULES and len(PLAIN_FIX_MODULES) > 40


@pytest.mark.parametrize("module", PLAIN_FIX_MODULES)
def test_a_fix_holds_no_parentheses_of_its_own(module):
    """UserError wraps its fix in parentheses: one inside reads "(check the path (relative to ...))"."""
    import ast

    tree = ast.parse((PACKAGE / module).read_text())
    names = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    nested = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or getattr(call.func, "id", None) != "UserError":
            continue
        fix = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "fix"), None)
        texts = fix_texts(fix, names) if fix is not None else []
        nested += [f"{module}:{call.lineno}: {text}" for text in texts if "(" in text]
    assert not nested


def test_a_long_where_reads_the_same_alone_and_before_what_was_wrong():
    """The config fuzzer's case: a key 200 levels deep is clipped by its ends, and clipped alike whatever follows it
    (the line once clipped `where:` with its colon, and the start no longer matched the key's own line)."""
    where = "searchSpace.batch_size._value" + "[0]" * 200
    line = UserError("9223372036854775808 is out of range", where, "use a whole number").line()
    assert line.startswith(UserError("", where).line().rstrip(":") + ": ") and len(line) < 400, line
