"""What the resource-pool tests share: a home of their own, its pools.yml, and a process holding a lease.

`home` is an autouse fixture: a test file imports it (`from pools_util import home  # noqa: F401`) and
every test there runs with TRIALKIT_HOME set to a fresh folder; a file that needs a pools.yml in every
test adds its own autouse fixture on top, asking for `home`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from experiment_util import TIMEOUT

# Takes SLOTS slots of the default pool for trial `holder-00000` of job `holder`, says "taken", holds them
# until killed: as another experiment's control plane would.
SLOTS_HOLDER = """
import sys, time
from trialkit.platforms import pools
assert pools.open_pool().take("holder-00000", "holder", int(sys.argv[1]))
print("taken", flush=True)
time.sleep(600)
"""

# A trial that notes its start, waits for the gate file, notes its end, and reports its x.
GATED = """
import os, time, trialkit
p = trialkit.get_next_parameter()
with open({log!r}, "a") as f:
    f.write(f"start {{time.time()}} {name}\\n")
while not os.path.exists({gate!r}):
    time.sleep(0.02)
with open({log!r}, "a") as f:
    f.write(f"end {{time.time()}} {name}\\n")
trialkit.report_final_result(p["x"])
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    return home


def pools_yml(home: Path, text: str) -> None:
    """The home's pools.yml: `text` is its pools, indented under `pools:`."""
    (home / "pools.yml").write_text("pools:\n" + text)


def pool_of(home: Path, slots: int) -> None:
    pools_yml(home, f"  default: {{slots: {slots}}}\n")


def config_refusal(home: Path, text: str) -> str:
    """The line of the UserError that reading a pools.yml of `text` (see pools_yml) raises."""
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    pools_yml(home, text)
    with pytest.raises(UserError) as caught:
        pools.read_config(home)
    return caught.value.line()


def start_holder(script: str, *args: str, stdin: Optional[int] = None) -> subprocess.Popen:
    """`python -c script args...` once it has said "taken" (its lease is held); killed if it does not."""
    holder = subprocess.Popen([sys.executable, "-c", script, *args], stdin=stdin, stdout=subprocess.PIPE, text=True)
    try:
        said = holder.stdout.readline().strip()
        assert said == "taken", said
    except BaseException:
        holder.kill()
        holder.communicate(timeout=TIMEOUT)
        raise
    return holder


def finish(proc: subprocess.Popen) -> str:
    """The stderr of a `trialkit run` started with start_cli, once it has exited 0."""
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return err
