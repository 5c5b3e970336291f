"""trialkit's GPU paths on a real GPU, one line each: OK, FAIL or NO-GPU, the figures and the reason.

    python3 tools/gpu_check/check.py [--device cuda|cpu] [--only NAME,...] [--budget SECONDS]

(tools/gpu_check.sh installs what the machine lacks first, then runs this.)
Each check runs in a process of its own, bounded in time; when it ends, every
process it started (found by a tag in their environment) is ended too, and a
check that left one running fails. The table is printed line by line as the
checks end, and written to $OUT/gpu_check.txt with the checks' output in
$OUT/gpu_check.log when OUT is set. On a machine without nvidia-smi (or whose
nvidia-smi lists no GPU) every line is NO-GPU and the exit status 0; else it
is 1 when a line FAILs. `--device cpu` rehearses the checks on the CPU (gloo,
the trials on the CPU) under a stand-in nvidia-smi first on PATH (the tests'):
the plumbing, not the GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, TextIO

from steps import CPU_SLOWER, STEPS  # the standard library only, until a check runs

HERE = Path(__file__).resolve().parent
TAG = "GPU_CHECK_TAG"
NAMES = [name for name, _, _ in STEPS]
BUDGET = 300.0  # seconds for every check on a GPU: the install and the whole run stay under 6 minutes (H200: ~4)
BUILD_BOUND = 150.0  # seconds for DeepSpeed's JIT build of FusedAdam, run beside the first checks
LEFT_GRACE = 5.0  # seconds a check's processes get to end by themselves after it returned


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.step:
        return run_step(args.step, args.device == "cuda")
    chosen = args.only.split(",") if args.only else NAMES
    unknown = [name for name in chosen if name not in NAMES]
    if unknown:
        print(f"gpu_check: no check named {', '.join(unknown)} (the checks: {', '.join(NAMES)})", file=sys.stderr)
        return 2
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    table = Table(out)
    absent = no_gpu()
    table.header(absent, args.device)
    if absent:
        for name in chosen:
            table.line(name, "NO-GPU", "", absent)
        return table.close()
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    log = open(out / "gpu_check.log" if out else work / "gpu_check.log", "w")
    build = FusedAdamBuild(work, out, args.device == "cuda") if "deepspeed_zero2" in chosen else None
    budget = args.budget if args.budget is not None else (BUDGET if args.device == "cuda" else float("inf"))
    deadline = time.monotonic() + budget
    try:
        for name in chosen:
            if name == "deepspeed_zero2" and build:
                build.finish(deadline - time.monotonic())
            table.line(name, *check(name, args.device, work, log, deadline))
    finally:
        if build:
            build.stop()
        log.close()
    print(f"gpu_check: the checks' output is in {log.name}", file=sys.stderr)
    if table.failed == 0:
        shutil.rmtree(work, ignore_errors=True)
    return table.close()


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the check); cpu rehearses it without a GPU, under a stand-in nvidia-smi that "
                             "must be first on PATH (tests/gpu_util.py's: ./bootstrap.sh test tests/test_gpu_check.py)")
    parser.add_argument("--only", metavar="NAME,...", help=f"only these checks (of {', '.join(NAMES)})")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help=f"time for all the checks (default {BUDGET:g} on cuda, none on cpu)")
    parser.add_argument("--step", choices=NAMES, help=argparse.SUPPRESS)  # one check, in the child check() starts
    return parser.parse_args(argv)


def no_gpu() -> Optional[str]:
    """Why this machine has no GPU to check; None when nvidia-smi lists one (or fails: a check then says so)."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH"
    import smi

    try:
        return None if smi.query() else "nvidia-smi lists no GPU"
    except smi.SmiError:
        return None


class Table:
    """The result table: a line per check, printed as it comes and kept for $OUT/gpu_check.txt."""

    def __init__(self, out: Optional[Path]):
        self.out = out
        self.lines: List[str] = []
        self.results: List[Dict[str, str]] = []
        self.failed = 0

    def header(self, absent: Optional[str], device: str) -> None:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.emit(f"trialkit GPU check, {when}, device {device}: {absent or machine()}")

    def line(self, name: str, status: str, figures: str, reason: str) -> None:
        self.failed += status == "FAIL"
        self.results.append({"check": name, "status": status, "figures": figures, "reason": reason})
        self.emit(f"{NAMES.index(name) + 1} | {name:<15} | {status:<6} | {figures} | {reason}")

    def emit(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)
        if self.out:  # line by line: a run stopped halfway still leaves what it found
            (self.out / "gpu_check.txt").write_text("\n".join(self.lines) + "\n")
            (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1) + "\n")

    def close(self) -> int:
        return 1 if self.failed else 0


def machine() -> str:
    """The GPUs, driver and torch, in a few words."""
    import smi

    try:
        text = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=20).stdout
        gpus = "; ".join(f"GPU {r.index} {r.name} {r.memory_total} MiB" for r in smi.parse_xml(text))
        versions = smi.driver(text)
    except (smi.SmiError, subprocess.TimeoutExpired, ValueError) as err:
        return f"nvidia-smi: {err}"
    torch = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=60).stdout.split()
    torch_words = f"torch {torch[0]} (CUDA usable: {torch[1]})" if len(torch) == 2 else "torch not importable"
    return f"{gpus}, driver {versions['driver']}, CUDA {versions['cuda']}, {torch_words}"


# ---------------------------------------------------------------- running one check


def check(name: str, device: str, work: Path, log: TextIO, deadline: float) -> tuple:
    """Run one check in a child process, bounded; (status, figures, reason)."""
    sys.path.insert(0, str(HERE.parent))
    import leftovers
    bound = dict((n, b) for n, _, b in STEPS)[name] * (1 if device == "cuda" else CPU_SLOWER)
    bound = min(bound, deadline - time.monotonic())
    if bound < 5:
        return "FAIL", "", "not run: the check's time budget was spent"
    step_dir = work / name
    step_dir.mkdir()
    tag = f"{name}-{os.getpid()}-{time.time_ns()}"
    environ = {**os.environ, TAG: tag, "GPU_CHECK_DEVICE": device}
    log.write(f"==== {name} (bound {bound:.0f} s) ====\n")
    log.flush()
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(HERE / "check.py"), "--step", name, "--device", device],
                            cwd=step_dir, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=bound)
        result = next((json.loads(line[len("RESULT "):]) for line in reversed(output.splitlines())
                       if line.startswith("RESULT ")), None)
        if result is None:
            result = {"status": "FAIL", "figures": "", "reason": f"the check exited {proc.returncode} with no result"}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        result = {"status": "FAIL", "figures": "", "reason": f"did not finish within its bound of {bound:.0f} s"}
    left = leftovers.end(TAG, tag, LEFT_GRACE)
    if left and result["status"] == "OK":
        result = {**result, "status": "FAIL", "reason": f"left running (ended by the check): {'; '.join(left)}"}
    log.write(output + f"---- {name}: {result['status']} in {time.monotonic() - began:.1f} s\n\n")
    log.flush()
    return result["status"], result["figures"], result["reason"]


def run_step(name: str, cuda: bool) -> int:
    """In the child: run the check, print RESULT <json> last."""
    import steps
    import user

    os.environ.update(user.step_env(Path.cwd()))

    began = time.monotonic()

    def log(text: str) -> None:
        print(f"[+{time.monotonic() - began:5.1f} s] {text}", flush=True)

    function = dict((n, f) for n, f, _ in steps.STEPS)[name]
    try:
        figures, reason = function(steps.Context(Path.cwd(), cuda, log))
        result = {"status": "OK", "figures": figures, "reason": reason}
    except steps.Failed as failed:
        result = {"status": "FAIL", "figures": failed.figures, "reason": failed.reason}
    except Exception as err:  # a check that breaks is a FAIL line with its cause, and the traceback in the log
        traceback.print_exc()
        result = {"status": "FAIL", "figures": "", "reason": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------- DeepSpeed's FusedAdam, built beside the checks


class FusedAdamBuild:
    """DeepSpeed's JIT build of FusedAdam in the background from the start, bounded; its result in a file.

    The DeepSpeed check reads the result (GPU_CHECK_FUSED_ADAM) and loads the
    op from the same TORCH_EXTENSIONS_DIR. On the CPU nothing is built.
    """

    def __init__(self, work: Path, out: Optional[Path], cuda: bool):
        self.result = work / "fused_adam.json"
        os.environ["GPU_CHECK_FUSED_ADAM"] = str(self.result)
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))
        self.proc: Optional[subprocess.Popen] = None
        if not cuda:
            self.write(False, reason="rehearsal on the CPU")
            return
        # Set for every check too: DeepSpeed's workers then load the op built for the same archs, not build anew.
        # Set, not defaulted: a CUDA image may name Hopper's arch-specific target (the device's said "9.0a"), which
        # DeepSpeed 0.19.8's JIT builder cannot parse (int("0a")): build for the GPU's own capability.
        self.arch = os.environ["TORCH_CUDA_ARCH_LIST"] = compute_capability()
        self.log = (out or work) / "fused_adam_build.log"
        cuda_home()
        # It asks NVML whether CUDA works (no CUDA context of its on the GPU), and builds the CUDA op, not a CPU one.
        environ = {**os.environ, "MAX_JOBS": str(os.cpu_count() or 4), "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                   "DS_ACCELERATOR": "cuda"}
        self.began = time.monotonic()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, str(HERE / "workloads" / "build_fused_adam.py")],
                                         stdout=log, stderr=subprocess.STDOUT, env=environ,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def finish(self, seconds_left: float) -> None:
        """Wait for the build (within its bound and the budget); write its result."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, min(BUILD_BOUND - (time.monotonic() - self.began), seconds_left - 60)))
        except subprocess.TimeoutExpired:
            self.stop()
            self.write(False, reason=f"the build did not finish within {time.monotonic() - self.began:.0f} s")
            return
        said = self.log.read_text(errors="replace").splitlines()
        built = next((line for line in reversed(said) if line.startswith("BUILT ")), None)
        if self.proc.returncode == 0 and built:
            self.write(True, seconds=float(built.split()[1]))
        else:
            errors = [line for line in said if "rror" in line] or said[-1:] or ["no output"]
            self.write(False, reason=f"exit {self.proc.returncode}: {errors[-1].strip()[:240]}")
        self.proc = None

    def write(self, built: bool, **facts) -> None:
        self.result.write_text(json.dumps({"built": built, "arch": getattr(self, "arch", None), **facts}))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def cuda_home() -> None:
    """Name the CUDA toolkit for torch's extension builder where it would not find it: no nvcc on PATH."""
    if os.environ.get("CUDA_HOME") or shutil.which("nvcc"):
        return
    found = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))
    if found:
        os.environ["CUDA_HOME"] = str(found[-1].parent.parent)


def compute_capability() -> str:
    """GPU 0's compute capability as nvidia-smi says it (9.0 on Hopper): build for it alone."""
    done = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=20)
    first = (done.stdout.split() or [""])[0]
    return first if re.fullmatch(r"\d+\.\d+", first) else "9.0"  # an old nvidia-smi without the field: Hopper's


if __name__ == "__main__":
    sys.exit(main())
