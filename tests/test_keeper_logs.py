"""The keeper's log capture: every byte to the files, echoed to its own output,
never blocking the trial, and surviving a full disk or a reader that went away."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from keeper_util import KEEPER, keeper, py, trial_dir
from trialkit.keeper.logs import DROP_NOTE, Echo, LineScanner

OUT = bytes(range(256)) * 64 + b"x" * (4 << 20) + b"\r\n" + b"\x00no newline at the end"
ERR = b"to stderr\n" * 1000


def _without_reporter_notes(stderr: bytes) -> bytes:
    return b"".join(line for line in stderr.splitlines(keepends=True) if b"records were not sent" not in line)


def test_binary_output_and_long_lines_reach_files_and_echo_unchanged(trial_env, tmp_path):
    (tmp_path / "out").write_bytes(OUT)
    (tmp_path / "err").write_bytes(ERR)
    k = keeper(["sh", "-c", 'cat "$0"/out; cat "$0"/err >&2', str(tmp_path)], trial_env)
    assert k.wait() == 0
    assert (trial_dir(trial_env) / "stdout.log").read_bytes() == OUT
    assert (trial_dir(trial_env) / "stderr.log").read_bytes() == ERR
    assert k.stdout == OUT
    assert _without_reporter_notes(k.stderr) == ERR


@pytest.mark.parametrize("log", ["full disk", "cannot be created"])
def test_unwritable_log_degrades_to_echo_only_with_one_warning(trial_env, log):
    trial_dir(trial_env).mkdir(parents=True)
    if log == "full disk":
        (trial_dir(trial_env) / "stdout.log").symlink_to("/dev/full")  # every write: ENOSPC
    else:
        (trial_dir(trial_env) / "stdout.log").mkdir()  # open(2): EISDIR
    k = keeper(py("""
        import sys
        for i in range(200):
            print("line", i, flush=True)
    """), trial_env)
    assert k.wait() == 0
    assert k.stdout == b"".join(b"line %d\n" % i for i in range(200))
    warnings = [line for line in k.stderr.splitlines() if b"warning" in line]
    assert len(warnings) == 1 and b"stdout.log" in warnings[0] and b"only echoed" in warnings[0]


def test_quiet_captures_without_echo(trial_env):
    k = keeper(["sh", "-c", "echo out; echo err >&2"], trial_env, "--quiet")
    assert k.wait() == 0
    assert k.stdout == b""
    assert _without_reporter_notes(k.stderr) == b""
    assert (trial_dir(trial_env) / "stdout.log").read_bytes() == b"out\n"
    assert (trial_dir(trial_env) / "stderr.log").read_bytes() == b"err\n"


def test_a_reader_that_went_away_costs_only_the_echo(trial_env):
    k = subprocess.Popen([*KEEPER, "--", *py("""
        for i in range(20000):
            print("line", i)
    """)], env=trial_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    k.stdout.close()  # like `kubectl logs` interrupted: our stdout now fails with EPIPE
    assert k.wait(60) == 0
    log = (trial_dir(trial_env) / "stdout.log").read_bytes()
    assert log == b"".join(b"line %d\n" % i for i in range(20000))


def test_signals_are_served_while_the_trial_floods_output(trial_env):
    # The keeper reads a bounded amount per turn of its loop; were it to read
    # for as long as data kept coming, the SIGTERM would wait for the flood to stop.
    trial_dir(trial_env).mkdir(parents=True)
    (trial_dir(trial_env) / "stdout.log").symlink_to("/dev/null")
    k = keeper(["sh", "-c", "trap 'exit 143' TERM; yes & yes & echo flooding >&2; wait"], trial_env,
               "--grace", "60", stdout=subprocess.DEVNULL)
    k.expect(b"flooding", "stderr")
    k.signal(signal.SIGTERM)
    assert k.wait(timeout=30) == 143  # the trial's answer, not the grace's SIGKILL


def test_echo_marks_a_gap_where_it_is():
    r, w = os.pipe()
    echo = Echo(w, limit=10)
    echo.put(b"a" * 8)
    echo.put(b"B" * 20)  # more than the whole buffer: left out of the echo
    echo.put(b"C" * 5)  # also left out: the gap goes on
    echo.put(b"d" * 2)
    echo.close(timeout=10)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        echoed = f.read()
    assert echoed in (
        b"a" * 8 + DROP_NOTE % 25 + b"d" * 2,  # "a" still held when B and C came
        b"a" * 8 + DROP_NOTE % 20 + b"C" * 5 + b"d" * 2,  # "a" already written: C fit
    )


SCANNED = [b"hello", b"NNISDK_MEb'{\"a\":1}'", b"NNISDK", b"NNISDK_MEb", b"NNISDK_MEb'" + b"x" * 100 + b"'\r",
           b"", b"xx NNISDK_MEb'no'", b"NNISDK_MEb'"]
STREAM = b"\n".join(SCANNED) + b"\nunfinished NNI"
MATCHES = [line.rstrip(b"\r") for line in SCANNED if line.startswith(b"NNISDK_MEb'")]


def _scan(cuts) -> list:
    found = []
    scanner = LineScanner(b"NNISDK_MEb'", found.append)
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    for start, end in zip(bounds, bounds[1:]):
        scanner.feed(STREAM[start:end])
    return found


def test_line_scanner_finds_prefixed_lines_across_every_single_cut():
    for cut in range(len(STREAM) + 1):
        assert _scan([cut]) == MATCHES, cut


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_line_scanner_finds_prefixed_lines_across_any_cuts(cuts):
    assert _scan(cuts) == MATCHES


def test_line_scanner_drops_a_line_longer_than_its_limit():
    found = []
    scanner = LineScanner(b"P:", found.append, max_line=10)
    scanner.feed(b"P:" + b"x" * 20 + b"\nP:ok\n")
    assert found == [b"P:ok"]
