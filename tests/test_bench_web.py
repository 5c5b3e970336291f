"""bench/bench_web.py in a Python without the browser's driver says so in one line (a new user got a traceback)."""
from __future__ import annotations

import subprocess
import sys

from harness import ROOT


def test_the_page_race_without_selenium_says_so_in_one_line():
    hide = ("import runpy, sys\n"
            "sys.modules['selenium'] = None  # as a venv without it\n"
            "sys.argv = ['bench_web.py']\n"
            f"runpy.run_path({str(ROOT / 'bench' / 'bench_web.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "bench_web.py: the page's race needs selenium (and Debian's chromium), which this Python lacks: run it with "
        "the venv that `./bootstrap.sh test` makes (.venv/bin/python)"], done.stderr
