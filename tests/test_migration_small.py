"""Small things users of other tools type out of habit (issue 23, item 7)."""
from __future__ import annotations

from experiment_util import cli


def test_job_ls_is_job_list(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    listed, ls = cli("job", "list"), cli("job", "ls")
    assert listed.returncode == ls.returncode == 0, ls.stderr
    assert ls.stdout == listed.stdout and ls.stderr == listed.stderr
    assert "ls" in cli("job", "--help").stdout
