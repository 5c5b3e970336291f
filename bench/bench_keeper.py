"""The keeper against tini and dumb-init, measured in the same run.

    python bench/bench_keeper.py [--runs 50]

Every wrapper runs the same tiny C child, which writes CLOCK_MONOTONIC to a
file at the moments that matter, so the figures are the wrapper's own cost:
  forwarding: SIGTERM sent to the wrapper -> the child's handler runs;
  exit:       the child's last instruction -> the wrapper's exit seen by us;
  start:      the wrapper's exec -> the child's first instruction, against a
              bare `python -c pass` (the floor of any Python keeper); both
              with bytecode cached, as a pip install leaves it.
Beside them runs the Python floor (bench/python_floor.py: spawn, forward,
reap, exit, nothing else): what any init written in Python pays, so that
the report says how much of the keeper's cost is the interpreter's and how
much its own. Samples are taken round-robin across the wrappers, the order rotating from
one round to the next, so that load on a shared machine falls on all of them
alike. Goals (issue 18): forwarding <= 1.2x tini, exit <= 2x tini, start <=
1.5x `python -c pass`. Needs `tini`, `dumb-init` (Debian packages) and a C
compiler.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"forwarding": 1.2, "exit": 2.0}  # at most this many times tini's
START_GOAL = 1.5  # at most this many times `python -c pass`

CHILD_C = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *out;

static void record(void) {
    struct timespec t;
    char line[64];
    clock_gettime(CLOCK_MONOTONIC, &t);
    int n = snprintf(line, sizeof line, "%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec);
    int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
    write(fd, line, n);
    close(fd);
}

static void on_term(int signum) {
    (void)signum;
    record();
    _exit(0);
}

/* child signal FILE | child exit FILE MICROSECONDS: records its start; then either waits for SIGTERM
   (recording when the handler runs) or records its last instruction and exits. */
int main(int argc, char **argv) {
    out = argv[2];
    record();
    if (strcmp(argv[1], "signal") == 0) {
        signal(SIGTERM, on_term);
        write(2, "ready\n", 6);
        for (;;) pause();
    }
    /* A trial runs a while: its exit must find the wrapper idle, not still starting
       (argv[3]: microseconds). */
    usleep(atoi(argv[3]));
    record();
    _exit(0);
}
"""


def build_child(workdir: Path) -> str:
    source, binary = workdir / "child.c", workdir / "child"
    source.write_text(CHILD_C)
    subprocess.run(["cc", "-O2", "-o", str(binary), str(source)], check=True)
    return str(binary)


def wrappers() -> Dict[str, List[str]]:
    """Each wrapper's command prefix: all of them signal the child's whole group."""
    return {
        "keeper": [sys.executable, "-m", "trialkit.keeper", "--grace", "5", "--"],
        "tini": ["tini", "-s", "-g", "--"],
        "dumb-init": ["dumb-init", "--"],
        "python floor": [sys.executable, str(ROOT / "bench" / "python_floor.py")],
    }


def _env(trial_dir: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["TRIALKIT_TRIAL_DIR"] = str(trial_dir)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # As installed (pip compiles every module): bytecode is cached, here in the
    # run's own dir, so that neither side compiles source on every start.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(trial_dir.parent / "pycache")
    return env


def _times(path: Path) -> List[float]:
    return [float(line) for line in path.read_text().split()]


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stderr.readline()
    if b"ready" not in line:
        raise RuntimeError(f"wrapper {proc.args[0]} did not start the child: {line!r}")


def sample_signal(prefix: Sequence[str], child: str, workdir: Path) -> Dict[str, float]:
    """One run: start cost and forwarding latency."""
    record = workdir / "times"
    record.unlink(missing_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen([*prefix, child, "signal", str(record)], env=_env(workdir / "trial"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_ready(proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    proc.stderr.close()
    child_start, handled = _times(record)
    return {"start": child_start - started, "forwarding": handled - sent}


# How long the child runs before its exit is timed. 50 ms was too short on a busy machine: at load 9-21
# the keeper was often still starting (its RUNNING status written after the child's exit, 5 of 6 runs
# at load 21), and its exit time held part of its start.
EXIT_AFTER_US = 500_000


def sample_exit(prefix: Sequence[str], child: str, workdir: Path) -> Dict[str, float]:
    """One run: the child's last instruction -> the wrapper's exit."""
    record = workdir / "times"
    record.unlink(missing_ok=True)
    proc = subprocess.Popen([*prefix, child, "exit", str(record), str(EXIT_AFTER_US)], env=_env(workdir / "trial"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.wait()  # no timeout: Popen.wait(timeout) polls with sleeps, which would be measured
    ended = time.monotonic()
    _, last = _times(record)
    return {"exit": ended - last}


def sample_python_pass(workdir: Path) -> Dict[str, float]:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], env=_env(workdir / "trial"), check=True)
    return {"python -c pass": time.monotonic() - started}


def collect(runs: int, child: str, workdir: Path) -> Dict[str, Dict[str, List[float]]]:
    """Round-robin samples: {wrapper: {measure: [seconds...]}}."""
    found: Dict[str, Dict[str, List[float]]] = {name: {} for name in [*wrappers(), "python"]}
    samplers: Dict[str, List[Callable[[], Dict[str, float]]]] = {
        name: [lambda p=prefix: sample_signal(p, child, workdir), lambda p=prefix: sample_exit(p, child, workdir)]
        for name, prefix in wrappers().items()
    }
    samplers["python"] = [lambda: sample_python_pass(workdir)]
    names = list(samplers)
    for run in range(runs):
        for name in names[run % len(names):] + names[:run % len(names)]:
            for fn in samplers[name]:
                for measure, seconds in fn().items():
                    found[name].setdefault(measure, []).append(seconds)
    return found


def report(found: Dict[str, Dict[str, List[float]]]) -> bool:
    """Print the medians and ratios; True when every goal is met."""
    med = {name: {m: statistics.median(v) for m, v in measures.items()} for name, measures in found.items()}
    print(f"{'median (ms)':<14}{'forwarding':>12}{'exit':>12}{'start':>12}")
    for name in wrappers():
        row = med[name]
        print(f"{name:<14}" + "".join(f"{row[m] * 1e3:12.3f}" for m in ("forwarding", "exit", "start")))
    print(f"{'python -c pass':<26}{'':>12}{med['python']['python -c pass'] * 1e3:12.3f}")
    ok = True
    print()
    for measure in ("forwarding", "exit", "start"):
        keeper, tini, dumb = med["keeper"][measure], med["tini"][measure], med["dumb-init"][measure]
        floor = med["python floor"][measure]
        line = (f"{measure:<11} keeper/tini {keeper / tini:7.2f}x   keeper/dumb-init {keeper / dumb:7.2f}x   "
                f"python floor/tini {floor / tini:6.2f}x")
        if measure in GOALS:
            met = keeper / tini <= GOALS[measure]
            ok &= met
            line += f"   goal <= {GOALS[measure]:g}x tini: {'MET' if met else 'MISSED'}"
            if floor / tini > GOALS[measure]:
                line += " (below the Python floor)"
        print(line)
    start = med["keeper"]["start"] / med["python"]["python -c pass"]
    ok &= start <= START_GOAL
    print(f"start       keeper/(python -c pass) {start:7.2f}x   goal <= {START_GOAL:g}x: "
          f"{'MET' if start <= START_GOAL else 'MISSED'}")
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return ok


def missing_tools() -> List[str]:
    return [tool for tool in ("tini", "dumb-init", "cc") if shutil.which(tool) is None]


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="samples per measure (median taken; default 50)")
    opts = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"bench_keeper: missing {', '.join(missing)}: this bench compares against tini and dumb-init "
              "and builds its child with cc; install them with `apt-get install -y tini dumb-init gcc`",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-keeper-") as tmp:
        workdir = Path(tmp)
        child = build_child(workdir)
        sample_signal(wrappers()["keeper"], child, workdir)  # fills the bytecode cache
        print(f"{opts.runs} samples each, round-robin; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}\n")
        return 0 if report(collect(opts.runs, child, workdir)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
