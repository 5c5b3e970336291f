"""A checkpoint store whose endpoint refuses the connection (a wrong endpointUrl, a store that is down) is one
short line naming the endpoint, that it refused, and what to check: obstore's own text for it is a paragraph
of retry counts and a debug dump. Real obstore against a loopback port nothing listens on; the other store
errors keep their words (tests/test_checkpoints*.py).
"""
from __future__ import annotations

import os

import pytest
import yaml

from experiment_util import cli
from harness import free_port
from test_checkpoints import NNI_TRIAL, one_line_error

pytest.importorskip("obstore", reason="obstore is trialkit's checkpoints extra")

FIX = "check the endpoint's host and port, and that the store runs there"
SHORT = 200  # characters: a line a terminal shows whole; obstore's text for it runs past 1,000


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def refused(monkeypatch) -> str:
    """An endpoint nothing listens on, and credentials (made up) so that the connection is what fails."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return f"http://127.0.0.1:{free_port()}"


def test_run_with_a_refused_endpoint_says_so_in_one_short_line(tmp_path, refused):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "trial.py").write_text(NNI_TRIAL)
    config = tmp_path / "code" / "config.yml"
    config.write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "python3 trial.py",
        "maxTrialNumber": 1, "tuner": {"name": "Random"}, "trainingService": {"platform": "local"},
        "checkpointStorage": {"type": "s3", "bucket": "ckpts", "endpointUrl": refused}}))
    done = cli("run", config, env=dict(os.environ))
    one_line_error(done, f"checkpointStorage: the checkpoint store s3://ckpts cannot be used: {refused} refused the "
                         f"connection ({FIX})")
    assert f"error: {config}:1: checkpointStorage: " in done.stderr  # at its key's line
    # Short but for the place, the config's path the user gave (here pytest's long one) and the line.
    assert len(done.stderr.replace(f"{config}:1: ", "")) < SHORT and "retries" not in done.stderr, done.stderr


def test_a_call_to_a_refused_store_is_one_short_line_with_its_fix(refused):
    from trialkit.checkpoints.store import ObjectStore, StoreError

    with pytest.raises(StoreError) as raised:
        ObjectStore({"type": "s3", "bucket": "ckpts", "endpoint_url": refused}).checkpoints("abc12345")
    assert str(raised.value) == f"the checkpoint store s3://ckpts failed: {refused} refused the connection ({FIX})"
    assert raised.value.fix == FIX  # `checkpoint list` and the others give it as the error's fix
