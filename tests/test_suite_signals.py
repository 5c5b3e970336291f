"""The suite passes however it is started: from a script's `cmd &` too.

A shell without job control starts a background command with SIGINT and
SIGQUIT ignored, and the ignored signal is inherited across exec by every
process the tests start: a test that sends Ctrl-C to what it started then
waits in vain (the adaptdl-ray and Ctrl-C tests failed so). conftest.py
handles SIGINT again in the pytest process, so its children start with the
default.
"""
from __future__ import annotations

import signal
import subprocess
import sys

from conftest import ROOT


def test_a_suite_started_in_the_background_of_a_script_still_delivers_ctrl_c():
    pytest = f"{sys.executable} -m pytest -q -p no:cacheprovider tests/test_manager_guard.py -k ctrl_c"
    # `( ... & wait )` in sh -c: the way a CI script or a nohup'd run starts the suite.
    done = subprocess.run(["sh", "-c", f"( {{ grep SigIgn /proc/self/status; exec {pytest}; }} & wait )"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    ignored = int(done.stdout.split("SigIgn:", 1)[1].split()[0], 16)
    assert ignored & (1 << (signal.SIGINT - 1)), "the shell did not ignore SIGINT: this test shows nothing here"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]
