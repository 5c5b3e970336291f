"""`experiment list` reads newest first, as the page's Experiments view does (a newcomer saw it sorted by the
random id). Three stores whose ids sort against their creation times; the page is a real `trialkit ui`.
"""
from __future__ import annotations

import sqlite3
import subprocess
from contextlib import closing

import pytest
import requests

from conftest import PYTHON
from experiment_util import cli
from harness import child_environ
from trialkit.manager.store import Store
from trialkit.statuses import SUCCEEDED

# id -> created (seconds since the epoch): "zzz" is the newest, "aaa" the oldest, so the ids' order is the wrong one.
CREATED = {"aaa00001": 1_700_000_000.0, "zzz00002": 1_700_000_100.0, "mmm00003": 1_700_000_050.0}


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    for experiment_id, created in CREATED.items():
        store = Store.in_dir(home / "experiments" / experiment_id)
        store.create_experiment(experiment_id, config={"experimentName": experiment_id[:3]}, status=SUCCEEDED)
        store.close()
        with closing(sqlite3.connect(home / "experiments" / experiment_id / "trialkit.db")) as db:
            db.execute("UPDATE experiments SET created=?, updated=?", (created, created))
            db.commit()
    return home


def test_experiment_list_is_newest_first_as_the_page_lists_them(home):
    listed = cli("experiment", "list")
    assert listed.returncode == 0, listed.stderr
    ids = [line.split()[0] for line in listed.stdout.splitlines()[2:]]
    assert ids == ["zzz00002", "mmm00003", "aaa00001"], listed.stdout
    assert "newest first" in cli("experiment", "list", "--help").stdout

    proc = subprocess.Popen([PYTHON, "-m", "trialkit.cli", "ui"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_environ(TRIALKIT_HOME=str(home)))
    try:
        base, token = proc.stdout.readline().split()[-1].split("/?token=")
        page = requests.get(f"{base}/api/ui/experiments", timeout=10,
                            headers={"Authorization": f"Bearer {token.split('#')[0]}"})
        assert [e["id"] for e in page.json()] == ids
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
