"""Launcher benchmarks, each against its peer measured in the same run.

    python bench/bench_launch.py [--size 1G] [--repeat 3] [--only throughput,failfast,start] [--loaded]
                                 [--producer file|yes]

- throughput: wrap_rank on SIZE of 100-byte lines against GNU
  `sed 's/^/[rank=0] /'` (same producer, see `producer`; output to /dev/null); goal
  (issue 18): at least 1.5x sed's MiB/s, on a quiet machine and a loaded one.
  Beside them, `cat` as the relay: it changes nothing, so its figure is how
  fast a relay behind this producer can be on this machine.
- failfast: one of 2 workers crashes -> the launcher has exited; ours against
  plain torchrun; goal: no slower, and under 1 s.
- start: the command -> the script's first line on our stdout; ours against
  plain torchrun; goal <= 1.1x.
With --loaded, a process burning one CPU runs beside both sides throughout.
Runs alternate between ours and the peer, the order flipping each round (a
shared machine's load then hits both alike); medians of --repeat runs. Each
line ends with the goal, MET or MISSED, and the machine's load.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LINE = "x" * 99  # with its "\n", 100 bytes
THROUGHPUT_GOAL = 1.5  # wrap_rank's MiB/s over sed's
START_GOAL = 1.1  # our start over torchrun's

CRASHER = """
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    print(f"crash at {time.time():.6f}", flush=True)
    os._exit(1)
signal.pause()  # honours SIGTERM: the default action
"""

FIRST_LINE = """
print("first line", flush=True)
"""


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    match = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes, e.g. 1G, 256M")
    return int(match.group(1)) * units[match.group(2)]


def environ() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # As installed (pip compiles every module): our modules' bytecode is cached, as torch's
    # already is, so that our side does not compile its source on every start.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "trialkit-bench-pycache")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["TRIALKIT_SLOTS_PER_NODE"] = "2"
    env["TRIALKIT_GRACE_SECONDS"] = "10"
    return env


def timed(argv: List[str], **kwargs) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - start


def medians(repeat: int, *measures: Callable[[], float]) -> List[float]:
    """Each measure run `repeat` times, taking turns, the order reversed every other round; the median of each."""
    runs: List[List[float]] = [[] for _ in measures]
    for round_ in range(repeat):
        pairs = list(zip(measures, runs))
        for measure, times in pairs if round_ % 2 == 0 else pairs[::-1]:
            times.append(measure())
    return [statistics.median(times) for times in runs]


def verdict(met: bool) -> str:
    return f"{'MET' if met else 'MISSED'}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def producer(kind: str, size: int, workdir: Path) -> str:
    """The shell line that writes SIZE bytes of lines (a constant line: no user input).

    yes: `yes | head -c`, two processes and a pipe between them; their CPU is
    shared by both sides and, on a busy machine, dilutes the ratio. file: `cat`
    of a file in the page cache, the cheapest producer, so that the ratio is the
    prefixers' own.
    """
    lines = f"yes {LINE} | head -c {size}"
    if kind == "yes":
        return lines
    path = workdir / "lines.txt"
    subprocess.run(["sh", "-c", f"{lines} > {shlex.quote(str(path))}"], check=True)
    return f"cat {shlex.quote(str(path))}"


def throughput(size: int, repeat: int, produce: str, what: str) -> None:
    if not shutil.which("sed"):
        print("throughput: no sed here; skipped")
        return
    alone, cat, sed, ours = medians(
        repeat,
        lambda: timed(["sh", "-c", f"{produce} > /dev/null"]),
        lambda: timed(["sh", "-c", f"{produce} | cat > /dev/null"]),
        lambda: timed(["sh", "-c", f"{produce} | sed 's/^/[rank=0] /' > /dev/null"]),
        lambda: timed([PY, "-m", "trialkit.launch.wrap_rank", "0", "--", "sh", "-c", produce], env=environ()),
    )
    mib = size / (1 << 20)
    # cat relays without changing a byte: how fast any relay in a pipe behind this producer can be here.
    print(f"throughput on {mib:.0f} MiB of 100-byte lines ({what}): producer alone {mib / alone:.0f} MiB/s, "
          f"cat as a relay {mib / cat:.0f} MiB/s ({sed / cat:.2f}x sed), "
          f"sed {mib / sed:.0f} MiB/s, wrap_rank {mib / ours:.0f} MiB/s -> wrap_rank is {sed / ours:.3f}x sed "
          f"(goal >= {THROUGHPUT_GOAL:g}x: {verdict(sed / ours >= THROUGHPUT_GOAL)})")


def failfast(repeat: int, workdir: Path) -> None:
    script = workdir / "crasher.py"
    script.write_text(textwrap.dedent(CRASHER))

    def measure(argv: List[str]) -> Callable[[], float]:
        def once() -> float:
            proc = subprocess.Popen(argv, env=environ(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            out = proc.stdout.read()
            proc.wait()
            ended = time.time()
            crashed = float(re.search(rb"crash at ([\d.]+)", out).group(1))
            return ended - crashed
        return once

    ours, peer = medians(repeat, measure([PY, "-m", "trialkit.launch.torch_distributed", str(script)]),
                         measure(torchrun(script)))
    print(f"fail-fast (a worker crashes -> the launcher has exited): ours {ours * 1000:.0f} ms, "
          f"torchrun {peer * 1000:.0f} ms -> ours is {ours / peer:.2f}x torchrun "
          f"(goal <= 1x and < 1 s: {verdict(ours <= peer and ours < 1.0)})")


def start(repeat: int, workdir: Path) -> None:
    script = workdir / "first_line.py"
    script.write_text(textwrap.dedent(FIRST_LINE))

    def measure(argv: List[str]) -> Callable[[], float]:
        def once() -> float:
            began = time.perf_counter()
            proc = subprocess.Popen(argv, env=environ(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            for line in proc.stdout:
                if b"first line" in line:
                    seen = time.perf_counter() - began
                    break
            proc.stdout.read()
            proc.wait()
            return seen
        return once

    ours, peer = medians(repeat, measure([PY, "-m", "trialkit.launch.torch_distributed", str(script)]),
                         measure(torchrun(script)))
    print(f"start (command -> the script's first line): ours {ours * 1000:.0f} ms, "
          f"torchrun {peer * 1000:.0f} ms -> ours is {ours / peer:.2f}x torchrun "
          f"(goal <= {START_GOAL:g}x: {verdict(ours / peer <= START_GOAL)})")


def torchrun(script: Path) -> List[str]:
    """Plain torchrun as our launcher runs it on one node with 2 workers."""
    return [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max_restarts", "0",
            "--master_port", str(free_port()), str(script)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def burner(on: bool) -> Iterator[None]:
    """A process spinning on one CPU while the block runs (nothing when off)."""
    proc = subprocess.Popen([PY, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if proc:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="throughput input (default 1G)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median counts")
    parser.add_argument("--only", default="throughput,failfast,start", help="which benchmarks, comma-separated")
    parser.add_argument("--loaded", action="store_true", help="burn one CPU beside both sides throughout")
    parser.add_argument("--producer", choices=("file", "yes"), default="file",
                        help="throughput's input: cat of a cached file (default) or yes | head")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    print(f"{os.cpu_count()} CPUs, {'loaded: one CPU burner running' if args.loaded else 'no added load'}, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp, burner(args.loaded):
        if "throughput" in chosen:
            throughput(args.size, args.repeat, producer(args.producer, args.size, Path(tmp)),
                       f"producer: {args.producer}")
        if "failfast" in chosen:
            failfast(args.repeat, Path(tmp))
        if "start" in chosen:
            start(args.repeat, Path(tmp))


if __name__ == "__main__":
    main()
