"""The `trialkit` command's surface: complete help, one-line errors, exit codes.

Mistakes a user makes (a bad argument, a missing file, an unknown id, a bad
config) give one line on stderr and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse

import pytest

from experiment_util import cli, experiment
from trialkit.cli import build_parser


def all_parsers(parser=None, name="trialkit"):
    """(command line, parser) for the top parser and every subcommand below it."""
    parser = parser or build_parser()
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from all_parsers(sub, f"{name} {sub_name}")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))


def test_every_command_has_a_description_and_every_option_a_help():
    seen = []
    for name, parser in all_parsers():
        seen.append(name)
        assert parser.description, f"{name} has no description"
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name}: {action.dest} has no help"
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    assert choice.help, f"{name} {choice.dest} has no summary"
    assert {"trialkit run", "trialkit render", "trialkit experiment list", "trialkit experiment show",
            "trialkit experiment stop", "trialkit experiment resume", "trialkit experiment export",
            "trialkit experiment plot", "trialkit trial list", "trialkit trial show", "trialkit trial logs",
            "trialkit trial kill"} <= set(seen)


@pytest.mark.parametrize("command", [[], ["run"], ["experiment"], ["trial", "logs"], ["experiment", "export"]])
def test_help_of_each_level_exits_zero(command):
    done = cli(*command, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: trialkit")
    assert not done.stderr


def bad_config(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("searchSpace: {x: {_type: uniform, _value: [0, 1]}}\ntrialCommand: python3 t.py\n"
                    "tuner: {name: TPE}\ntrialConcurency: 2\n")
    return path


@pytest.mark.parametrize("args, says", [
    ([], "COMMAND"),
    (["launch"], "invalid choice"),
    (["run"], "CONFIG"),
    (["run", "missing.yml"], "cannot read"),
    (["run", bad_config, "--port", "eighty"], "--port"),
    (["run", bad_config, "--port", "70000"], "out of range"),
    (["run", bad_config], "trialConcurency"),
    (["render", bad_config, "--trial", "-1"], "--trial"),
    (["experiment", "show", "nosuchid"], "no experiment 'nosuchid'"),
    (["experiment", "resume", "nosuchid"], "no experiment"),
    (["experiment", "stop", "nosuchid"], "no experiment"),
    (["experiment", "export", "nosuchid", "--format", "xml"], "invalid choice"),
    (["experiment", "plot", "nosuchid"], "-o"),
    (["trial", "show", "nodash"], "not a trial id"),
    (["trial", "logs", "nosuchid-00001"], "no experiment"),
    (["trial", "kill", "x"], "not a trial id"),
    (["trial", "show", "nosuch-00000"], "TRIAL_ID: no experiment 'nosuch'"),  # the argument the user gave
    (["job", "update", "nosuch", "--priority", "3"], "'nosuch' is neither a trial id nor an experiment id"),
    # An unknown option points at the --help of the command it was given to, as a missing argument does.
    (["experiment", "list", "--bogus"], "unrecognized arguments: --bogus (see trialkit experiment list --help)"),
    (["job", "update", "x", "--priority", "1", "--bogus"], "(see trialkit job update --help)"),
    (["--bogus", "experiment", "list"], "unrecognized arguments: --bogus (see trialkit --help)"),
])
def test_mistakes_give_one_line_and_exit_2(tmp_path, args, says):
    done = cli(*[a(tmp_path) if callable(a) else a for a in args])
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("trialkit: error: ")
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not done.stdout


def test_render_of_a_local_config_is_refused_in_one_line(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "pass\n")
    done = cli("render", config)
    assert done.returncode == 2 and "nothing to render" in done.stderr and done.stderr.count("\n") == 1


def test_render_prints_a_clusters_objects_without_the_token(tmp_path):
    config = tmp_path / "kubeflow.yml"
    config.write_text(
        "searchSpace: {lr: {_type: loguniform, _value: [0.001, 0.1]}}\n"
        "tuner: {name: Random}\n"
        "trainingService:\n"
        "  platform: kubeflow\n"
        "  managerAddress: 10.0.0.5\n"
        "  master: {replicas: 1, command: python3 train.py, image: example/train:1}\n")
    done = cli("render", config, "--trial", "1", "-o", tmp_path / "out" / "k8s")  # made, as a user expects
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "k8s" / "render-00001.yaml").read_text()
    assert "kind: PyTorchJob" in text and "http://10.0.0.5:" in text
    assert "<redacted>" not in text  # the token travels by Secret reference only
    assert "secretKeyRef" in text


def test_render_into_what_cannot_be_a_directory_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    config = tmp_path / "kubeflow.yml"
    config.write_text("searchSpace: {lr: {_type: choice, _value: [0.1]}}\ntuner: {name: Random}\n"
                      "trainingService: {platform: kubeflow, managerAddress: 10.0.0.5, "
                      "master: {replicas: 1, command: python3 train.py, image: example/train:1}}\n")
    done = cli("render", config, "-o", tmp_path / "file" / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "-o: cannot make the directory" in done.stderr


def test_experiment_list_with_none():
    done = cli("experiment", "list")
    assert done.returncode == 0 and "no experiments" in done.stdout
