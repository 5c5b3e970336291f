"""`trial list` stays narrow when a trial says why it failed: the status column holds the status word, the
reason goes in a last `why` column, cut to the terminal's width (a pseudo-terminal of 100 columns here) and
whole when piped; `trial show` has it whole. A real experiment whose one trial fails with a long reason.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios

import pytest

from experiment_util import PYTHON, TIMEOUT, cli, experiment, experiment_id

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [1]}}
WHY = "a reason long enough to be cut: " + "the data loader could not open its shard " * 3
FAILS = f"import sys\nprint({WHY!r}, file=sys.stderr)\nsys.exit(3)\n"


def columns(listed: str) -> list:
    """A table's lines as {header: cell}, cells split at runs of two spaces or more."""
    header, _, *lines = listed.splitlines()
    names = re.split(r"\s{2,}", header.strip())
    return [dict(zip(names, re.split(r"\s{2,}", line.strip()))) for line in lines]


def on_a_terminal(columns: int, *args: str) -> str:
    """`trialkit ARGS...` with its stdout a terminal `columns` wide; what it printed there."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}  # the terminal's width
        done = subprocess.run([PYTHON, "-m", "trialkit.cli", *args], stdout=side, stderr=subprocess.PIPE,
                              timeout=TIMEOUT, env=env)
        assert done.returncode == 0, done.stderr
    finally:
        os.close(side)
    out = b""
    try:
        while chunk := os.read(main, 65536):
            out += chunk
    except OSError:  # EIO: everything written was read, and no one holds the terminal's other side
        pass
    finally:
        os.close(main)
    return out.decode().replace("\r\n", "\n")


def test_a_failed_trials_reason_goes_in_a_last_column_cut_to_the_terminal(tmp_path):
    done = cli("run", experiment(tmp_path, X, FAILS, maxTrialNumber=1, trialConcurrency=1))
    exp = experiment_id(done.stdout.splitlines()[0])
    trial = f"{exp}-00000"
    reason = cli("trial", "show", trial).stdout.splitlines()[1].split(": ", 1)[1]
    assert WHY.strip() in reason, reason

    piped = cli("trial", "list", exp).stdout
    [row] = columns(piped)
    assert row["status"] == "FAILED", piped  # the word alone: the column is as wide as its widest word
    assert row["why"] == reason, piped  # piped: whole, for grep and files

    narrow = on_a_terminal(100, "trial", "list", exp)
    assert max(map(len, narrow.splitlines())) <= 100, narrow
    [row] = columns(narrow)
    assert row["status"] == "FAILED" and row["why"].endswith("…") and reason.startswith(row["why"][:-1]), narrow
