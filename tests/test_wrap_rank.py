"""wrap_rank: every byte through, each line prefixed once, no hang, exit codes and signals as the keeper's."""
from __future__ import annotations

import random
import signal
import subprocess

import pytest

from launch_support import PY, Proc, launch_env, write
from trialkit import env
from trialkit.launch import link
from trialkit.launch.prefix import LinePrefixer
from trialkit.launch.wrap_rank import READ_SIZE

P = b"[rank=0] "


def reference(data: bytes, prefix: bytes = P) -> bytes:
    """The rule, one byte at a time: a line starts the stream, follows \\n, or follows a \\r not before \\n."""
    out = bytearray()
    starting = True
    for i, byte in enumerate(data):
        if starting:
            out += prefix
            starting = False
        out.append(byte)
        starting = byte == 10 or (byte == 13 and data[i + 1 : i + 2] != b"\n")
    return bytes(out)


def prefixed(chunks, prefix: bytes = P) -> bytes:
    lines = LinePrefixer(prefix)
    out = b"".join(bytes(b) for chunk in chunks for b in lines.feed(chunk))
    return out + b"".join(bytes(b) for b in lines.finish())


def test_prefixer_matches_the_rule_however_the_stream_is_cut():
    pieces = [b"a", b"\n", b"\r", b"\r\n", "€".encode(), b"\xff\xfe", b"", b"xyz"]
    rng = random.Random(7)
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 6))))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        assert prefixed(chunks) == reference(data), (data, cuts)


def test_prefixer_emits_whole_lines_only():
    lines = LinePrefixer(P)
    assert lines.feed(b"half a line, \xe2\x82") == []  # a euro sign cut in two stays held
    assert b"".join(bytes(b) for b in lines.feed(b"\xac done\nnext")) == P + "half a line, € done\n".encode()
    assert b"".join(bytes(b) for b in lines.finish()) == P + b"next"


def run_wrapped(tmp_path, body: str, *args: str, rank: str = "0", env=None, timeout: float = 60):
    script = write(tmp_path, "child.py", body)
    return subprocess.run([PY, "-m", "trialkit.launch.wrap_rank", rank, "--", PY, str(script), *args],
                          env=env or launch_env(tmp_path), capture_output=True, timeout=timeout)


WRITE_STDIN_BYTES = """
import sys
data = sys.stdin.buffer.read()
sys.stdout.buffer.write(data)
sys.stderr.buffer.write(data[::-1])
"""


@pytest.mark.parametrize("data", [
    b"plain\nlines\n",
    b"windows\r\nline ends\r\n",
    b"progress 10%\rprogress 50%\rprogress 100%\ndone\n",
    b"not utf-8: \xff\xfe\xc3\x28 and a lone \x80\n",
    b"no line end at the end",
    b"\n\n\r\r\n\r",
    bytes(random.Random(3).randrange(256) for _ in range(1 << 20)),  # binary noise
    b"x" * (10 * 1024 * 1024) + b"\n" + b"y" * 100,  # a 10 MB line
], ids=["lf", "crlf", "cr", "invalid-utf8", "no-final-lf", "empty-lines", "binary-noise", "10mb-line"])
def test_bytes_are_preserved(tmp_path, data):
    script = write(tmp_path, "child.py", WRITE_STDIN_BYTES)
    done = subprocess.run([PY, "-m", "trialkit.launch.wrap_rank", "0", PY, str(script)],
                          env=launch_env(tmp_path), input=data, capture_output=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout == reference(data)
    assert done.stderr == reference(data[::-1])


def test_a_character_across_a_read_boundary_stays_whole(tmp_path):
    # The child writes a full read's worth minus one byte, plus the first byte
    # of a euro sign; wrap_rank reads that much; only then the rest comes.
    body = f"""
    import os, sys
    os.write(1, b"ready\\n" + b"a" * ({READ_SIZE} - 7) + "€".encode()[:1])
    sys.stdin.readline()
    os.write(1, "€".encode()[1:] + b" end\\n")
    """
    script = write(tmp_path, "child.py", body)
    proc = Proc([PY, "-m", "trialkit.launch.wrap_rank", "0", PY, str(script)], launch_env(tmp_path),
                stdin=subprocess.PIPE)
    proc.wait_for(r"\[rank=0\] ready\n")
    proc.popen.stdin.write(b"go\n")
    proc.popen.stdin.close()
    assert proc.finish(60) == 0
    assert proc.out == P + b"ready\n" + P + b"a" * (READ_SIZE - 7) + "€ end\n".encode()


def test_a_child_that_closes_stdout_and_keeps_running(tmp_path):
    body = """
    import os, sys, time
    print("before", flush=True)
    os.close(1)
    for i in range(3):
        print(f"still running {i}", file=sys.stderr, flush=True)
        time.sleep(0.05)
    """
    done = run_wrapped(tmp_path, body)
    assert done.returncode == 0
    assert done.stdout == P + b"before\n"
    assert done.stderr == b"".join(P + b"still running %d\n" % i for i in range(3))


def test_rank_from_the_first_variable_set(tmp_path):
    done = run_wrapped(tmp_path, "print('hi')", rank="RANK,HOROVOD_RANK,PMI_RANK",
                       env=launch_env(tmp_path, HOROVOD_RANK="3", PMI_RANK="5", RANK=""))
    assert done.stdout == b"[rank=3] hi\n"


def test_no_rank_is_one_line_and_exit_2(tmp_path):
    done = run_wrapped(tmp_path, "print('hi')", rank="NO_SUCH_RANK_A,NO_SUCH_RANK_B")
    assert done.returncode == 2
    assert done.stderr.count(b"\n") == 1 and b"none of NO_SUCH_RANK_A, NO_SUCH_RANK_B is set" in done.stderr


@pytest.mark.parametrize("body, code", [
    ("raise SystemExit(3)", 3),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
])
def test_exit_code_as_the_keeper(tmp_path, body, code):
    assert run_wrapped(tmp_path, body).returncode == code


def test_command_not_found_is_127(tmp_path):
    done = subprocess.run([PY, "-m", "trialkit.launch.wrap_rank", "1", "--", "no-such-command-here"],
                          env=launch_env(tmp_path), capture_output=True, timeout=60)
    assert done.returncode == 127
    assert done.stderr.startswith(b"[rank=1] trialkit.launch.wrap_rank: no-such-command-here: command not found")


def test_signals_reach_the_childs_group_and_sigterm_stops_it(tmp_path):
    body = """
    import signal, subprocess, sys
    def note(signum, frame):
        print(f"got {signal.Signals(signum).name}", flush=True)
        if signum == signal.SIGTERM:
            sys.exit(143)
    signal.signal(signal.SIGUSR1, note)
    signal.signal(signal.SIGTERM, note)
    grandchild = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    print("ready", flush=True)
    while True:
        signal.pause()
    """
    script = write(tmp_path, "child.py", body)
    proc = Proc([PY, "-m", "trialkit.launch.wrap_rank", "0", PY, str(script)], launch_env(tmp_path))
    proc.wait_for("ready")
    proc.signal(signal.SIGUSR1)
    proc.wait_for("got SIGUSR1")
    proc.signal(signal.SIGTERM)
    assert proc.finish(30) == 143
    # The grandchild in the same group took the SIGTERM too (the fixture checks nothing is left).
    assert proc.out.count(b"got SIGTERM") == 1



def test_an_endless_line_goes_out_in_pieces_cut_between_characters(monkeypatch):
    from trialkit.launch import prefix
    monkeypatch.setattr(prefix, "MAX_LINE", 8)
    euro = "€".encode()
    chunks = [b"abcdefgh" + euro[:2], euro[2:] + b"ijklmnopq", b"rst\nnext"]
    lines = LinePrefixer(P)
    pieces = [b"".join(bytes(b) for b in lines.feed(chunk)) for chunk in chunks]
    assert pieces[0] == P + b"abcdefgh"  # the euro sign's first bytes wait for the rest
    assert pieces[1] == euro + b"ijklmnopq"  # no second prefix for the same line
    assert pieces[2] == b"rst\n"
    assert b"".join(bytes(b) for b in lines.finish()) == P + b"next"


def test_a_short_or_refused_write_continues_where_it_stopped():
    # A non-blocking pipe with a slow reader takes each writev only in part, or not at all for a while:
    # every byte must still go out once, in order (the common case checks only that all went at once).
    import os
    import threading
    import time

    from trialkit.launch.wrap_rank import _writev_all

    buffers = [bytes([65 + i % 26]) * size for i, size in enumerate([1, 70_000, 0, 130_001, 3, 200_000] * 4)]
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    received = bytearray()

    def drain() -> None:
        while True:
            time.sleep(0.001)  # slower than the writer: the pipe fills
            data = os.read(read_fd, 50_000)
            if not data:
                return
            received.extend(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        _writev_all(write_fd, buffers)
    finally:
        os.close(write_fd)  # the reader's EOF, even when the write fails: no thread left behind
    reader.join(timeout=30)
    os.close(read_fd)
    assert bytes(received) == b"".join(buffers)


def test_the_script_gets_the_users_tmpdir_back():
    """The engine's TMPDIR is the launch's own dir (removed at its end); the script gets the user's."""
    launched = {"TMPDIR": "/tmp/trialkit-launch-x", env.LAUNCH_SOCKET: "/tmp/trialkit-launch-x/workers.sock", "A": "1"}
    assert link.script_environ({**launched, env.LAUNCH_USER_TMPDIR: "/scratch"}) == {"TMPDIR": "/scratch", "A": "1"}
    assert link.script_environ({**launched, env.LAUNCH_USER_TMPDIR: ""}) == {"A": "1"}  # it was unset
    assert link.script_environ({"TMPDIR": "/scratch"}) == {"TMPDIR": "/scratch"}  # not under a launcher
