"""A tuner, assessor or advisor named wrong, as a new user from NNI names them: a misspelt name gets the nearest
one (NNI's aliases among them), an assessor under tuner or a tuner under assessor is told which kind it is and
where it goes, and a tuner beside an advisor is told which key to remove. `trialkit run` of a real file: one line,
exit 2, no traceback, at the line of the key as written.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from experiment_util import cli

pytestmark = pytest.mark.usefixtures("home")

HEAD = "searchSpace: {x: {_type: choice, _value: [1, 2]}}\ntrialCommand: python3 -c pass\n"


def refused(tmp_path: Path, text: str) -> str:
    """What `trialkit run` says of a config with HEAD and `text`: its one line, after the file's path."""
    path = tmp_path / "config.yml"
    path.write_text(HEAD + text)
    done = cli("run", path)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    return line.replace(f"trialkit: error: {path}:", "")


@pytest.mark.parametrize("written, meant", [
    ("PBTTunner", "PBTTuner"),  # NNI 3.0's alias, misspelt
    ("GPTunr", "GPTuner"),
    ("Hyperbnd", "Hyperband"),
])
def test_a_misspelt_tuner_gets_the_nearest_name_nni_or_trialkit_spells(tmp_path, written, meant):
    assert refused(tmp_path, f"tuner: {{name: {written}}}\n") == (
        f"3: tuner.name: unknown tuner {written!r} (did you mean {meant!r}?)")


def test_a_misspelt_assessor_and_advisor_get_the_nearest_name_too(tmp_path):
    assert refused(tmp_path, "tuner: {name: TPE}\nassessor: {name: Mediansotp}\n") == (
        "4: assessor.name: unknown assessor 'Mediansotp' (did you mean 'Medianstop'?)")
    assert refused(tmp_path, "advisor: {name: BOHBB}\n") == "3: advisor.name: unknown advisor 'BOHBB' (did you mean 'BOHB'?)"


def test_an_nni_tuner_that_trialkit_does_not_carry_is_refused_by_its_alias_too(tmp_path):
    line = refused(tmp_path, "tuner: {name: MetisTuner}\n")
    assert line.startswith("3: tuner.name: NNI's tuner 'Metis' is not available in trialkit: ") and line.count("(") == 1


@pytest.mark.parametrize("key, written", [("tuner", "ASHA"), ("tuner", "medianstop"), ("advisor", "Curvefitting")])
def test_an_assessor_named_as_the_tuner_is_told_it_is_an_assessor_and_where_it_goes(tmp_path, key, written):
    name = {"medianstop": "Medianstop"}.get(written, written)
    kind = "an advisor" if key == "advisor" else "a tuner"
    assert refused(tmp_path, f"{key}:\n  name: {written}\n") == (
        f"4: {key}.name: {name} is an assessor, not {kind}: it stops poor trials early and picks no parameters "
        f"(move it to assessor: {{name: {name}}} and name a tuner here, like TPE)")


def test_a_misspelt_assessor_named_as_the_tuner_is_told_which_assessor_it_reads_like(tmp_path):
    """Near no tuner's name but an assessor's (newcomer8: Medianstp under tuner listed every tuner)."""
    assert refused(tmp_path, "tuner: {name: Medianstp}\n") == (
        "3: tuner.name: Medianstp is not a tuner; it reads like the assessor Medianstop, which stops poor trials "
        "early and picks no parameters (move it to assessor: {name: Medianstop} and name a tuner here, like TPE)")
    assert refused(tmp_path, "tuner: {name: Zzzq}\n").startswith("3: tuner.name: unknown tuner 'Zzzq' (use one of: ")


def test_a_tuner_named_as_the_assessor_is_told_it_is_a_tuner(tmp_path):
    assert refused(tmp_path, "tuner: {name: Random}\nassessor: {name: TPE}\n") == (
        "4: assessor.name: TPE is a tuner, not an assessor: it picks the parameters to try (name it under tuner: "
        "{name: TPE} and name an assessor here, like Medianstop, or remove the assessor)")
    assert refused(tmp_path, "tuner: {name: Random}\nassessor: {name: Hyperband}\n") == (
        "4: assessor.name: Hyperband is a tuner that also stops trials itself, an advisor in NNI, not an assessor "
        "(name it under tuner: {name: Hyperband} and remove the assessor)")


def test_a_tuner_beside_an_advisor_is_told_which_key_to_remove(tmp_path):
    assert refused(tmp_path, "tuner: {name: TPE}\nadvisor:\n  name: BOHB\n  classArgs: {max_budget: 27}\n") == (
        "4: advisor: both tuner and advisor are given: an advisor is a tuner that also decides which trials stop, "
        "and an experiment has one of the two, as in NNI (keep one of the two keys: remove advisor: to search with "
        "TPE, or remove tuner: to search with BOHB, its classArgs with it)")


def test_an_nni_v1_config_is_told_by_its_own_keys(tmp_path):
    text = ("authorName: x\nexperimentName: x\ntrialConcurrency: 1\ntrainingServicePlatform: local\n"
            "searchSpacePath: space.json\ntuner:\n  builtinTunerName: PBTTunner\n"
            "assessor:\n  builtinAssessorName: TPE\ntrial:\n  command: python3 -c pass\n  codeDir: .\n")
    (tmp_path / "space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
    path = tmp_path / "v1.yml"
    path.write_text(text)
    done = cli("run", path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert f"{path}:7: tuner.builtinTunerName: unknown tuner 'PBTTunner' (did you mean 'PBTTuner'?; " in done.stderr
    assert f"{path}:9: assessor.builtinAssessorName: TPE is a tuner, not an assessor" in done.stderr
    # Its fix writes the section as a v1 config does.
    assert "name it under tuner: {builtinTunerName: TPE}" in done.stderr and "{name:" not in done.stderr, done.stderr
