"""The cost of trialkit's periodic AdaptDL checkpoints on the training loop; and of a checkpoint's trip to an
object store against the library's own copy of the same files.

    python bench/bench_checkpoint.py [--runs 5] [--steps 600]
    python bench/bench_checkpoint.py --object-store [--gigabytes 1] [--samples 3]

One small AdaptDL training job (an MLP of 1.3 M parameters, one replica, CPU,
gloo), run as the keeper runs a trial's Python: checkpoints off
(TRIALKIT_CHECKPOINT_EVERY=0, AdaptDL untouched) against the hook at the
default interval, alternating, so the machine's load falls on both alike. A
third kind, the hook with a 1 s interval, measures what one checkpoint costs.
Printed, medians over the runs:
  - the time of a step (a step with no checkpoint due: the hook adds a clock read);
  - the time of one checkpoint, and its share of training at the default
    interval (checkpoint time / interval);
  - what the hook adds to a step with nothing due, timed alone (its flag and its
    wrapper, 200000 times): on a shared machine the step-time difference
    between the runs is mostly noise;
  - the overhead at the default interval: that per-step cost over the step
    time plus the checkpoints' share. Goal: under 1% (MET/MISSED);
  - AdaptDL's start-up (its reducer connecting to rank 0): without the hook its
    rank 0 usually loses the race against its own server thread and sleeps 5 s.

--object-store: a checkpoint of --gigabytes (one big file, the model, and four
of a sixteenth each, the optimizer's shards) saved to and restored from an S3
server on loopback (moto's, the checkpoint-tests extra) by trialkit's store
(trialkit/checkpoints/store.py: the files, then the manifest; restored beside
its place, sizes checked, moved in) against obstore's own put and get of the
same files, one after another with the library's defaults. Alternating which
goes first, --samples times; medians of each, and the ratio for the save and for
the restore. Goal: within 1.2x (MET/MISSED).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trialkit import env  # noqa: E402

GOAL = 0.01  # of step time, at the default interval
STORE_GOAL = 1.2  # trialkit's save (and restore) of a checkpoint against the library's own copy of its files
SAVED = re.compile(r"trialkit: checkpoint at step \d+ \(epoch \S+\) in ([0-9.]+) s")

WORKLOAD = '''
import sys, time
import numpy
numpy.int = int  # adaptdl 0.2.11's goodput model still calls it
import torch
import adaptdl.torch as adl
from torch.utils.data import TensorDataset

torch.set_num_threads(1)
steps = int(sys.argv[1])
started = time.monotonic()
adl.init_process_group("gloo")
print(f"init {time.monotonic() - started:.4f}", flush=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model = adl.AdaptiveDataParallel(model, optimizer)
data = TensorDataset(torch.randn(64 * steps, 256), torch.randint(0, 10, (64 * steps,)))
loader = adl.AdaptiveDataLoader(data, batch_size=64, drop_last=True)
times = []
for epoch in adl.remaining_epochs_until(1):
    last = time.perf_counter()
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
times.sort()
print(f"step {times[len(times) // 2]:.6f} total {sum(times):.4f}", flush=True)

# What the hook adds to a step with nothing due, alone: its flag and its wrapper
# around AdaptDL's profile() (here around a no-op), against the bare flag and no-op.
import contextlib
import adaptdl._signal
import adaptdl.torch.data
hook = getattr(adaptdl.torch.data.get_exit_flag, "__self__", None)
if hook is not None:
    class Future:
        def result(self):
            return False
    class Helper:
        future_exit = Future()
    helper, calls = Helper(), 200000
    wrapped = hook.profile(lambda helper, commit: contextlib.nullcontext())
    bare, flag = adaptdl._signal.get_exit_flag, adaptdl.torch.data.get_exit_flag
    best = []
    for body in ((lambda: bare(), lambda: contextlib.nullcontext()), (lambda: flag(), lambda: wrapped(helper, True))):
        started = time.perf_counter()
        for _ in range(calls):
            body[0]()
            with body[1]():
                pass
        best.append((time.perf_counter() - started) / calls)
    print(f"added {best[1] - best[0]:.9f}", flush=True)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(kind: str, every: float, steps: int, workdir: Path) -> Dict[str, object]:
    script = workdir / "workload.py"
    checkpoints = tempfile.mkdtemp(dir=workdir)  # fresh: a checkpoint left there would be resumed
    trial = env.read({env.CHECKPOINT_DIR: checkpoints, env.CHECKPOINT_EVERY: f"{every:g}",
                      env.TRIAL_DIR: str(workdir)})
    environ = trial.child_environ()  # the keeper's: the hook on PYTHONPATH when every > 0
    # A port as adaptdl-ray gives rank 0 (with none, AdaptDL's reducer always retries once).
    environ.update(PYTHONWARNINGS="ignore", ADAPTDL_MASTER_ADDR="127.0.0.1", ADAPTDL_MASTER_PORT=str(free_port()))
    result = subprocess.run([sys.executable, str(script), str(steps)], env=environ, capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{result.stderr[-3000:]}")
    numbers = dict(re.findall(r"^(init|step|added) (-?[0-9.]+)", result.stdout, re.M))
    return {"init": float(numbers["init"]), "step": float(numbers["step"]), "added": float(numbers.get("added", 0)),
            "saves": [float(s) for s in SAVED.findall(result.stderr)]}


def make_checkpoint(root: Path, size: int) -> None:
    """The model (3/4 of `size`) and four optimizer shards (1/16 each), of random bytes (nothing compresses)."""
    root.mkdir(parents=True)
    parts = {"model.pt": size * 3 // 4, **{f"optimizer-{i}.pt": size // 16 for i in range(4)}}
    block = os.urandom(1 << 20)
    for name, length in parts.items():
        with open(root / name, "wb") as out:
            for _ in range(length >> 20):
                out.write(block)


def object_store_race(gigabytes: float, samples: int) -> int:
    import obstore
    import requests

    from trialkit.checkpoints.store import ObjectStore

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.put(f"{url}/bench-ckpts", timeout=5).raise_for_status()
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        ours = ObjectStore({"type": "s3", "bucket": "bench-ckpts", "endpoint_url": url, "prefix": "ours"})
        from obstore.store import S3Store

        theirs = S3Store("bench-ckpts", prefix="theirs", config={"endpoint": url}, client_options={"allow_http": True})
        times: Dict[str, List[float]] = {key: [] for key in ("ours save", "theirs save", "ours restore",
                                                             "theirs restore")}
        with tempfile.TemporaryDirectory(prefix="tkbench-store-") as tmp:
            src = Path(tmp) / "checkpoint"
            make_checkpoint(src, int(gigabytes * (1 << 30)))
            files = sorted(p.name for p in src.iterdir())
            size = sum((src / name).stat().st_size for name in files)

            def ours_trip(n: int) -> None:
                started = time.perf_counter()
                ckpt = ours.upload(src, "bench", "bench-00000", f"sample-{n}", 0, "dir", {})
                times["ours save"].append(time.perf_counter() - started)
                started = time.perf_counter()
                ours.download(ckpt, Path(tmp) / f"ours-{n}")
                times["ours restore"].append(time.perf_counter() - started)
                ours.delete(ckpt)

            def theirs_trip(n: int) -> None:
                started = time.perf_counter()
                for name in files:
                    obstore.put(theirs, f"sample-{n}/{name}", src / name)
                times["theirs save"].append(time.perf_counter() - started)
                dest = Path(tmp) / f"theirs-{n}"
                dest.mkdir()
                started = time.perf_counter()
                for name in files:
                    with open(dest / name, "wb") as out:
                        for chunk in obstore.get(theirs, f"sample-{n}/{name}"):
                            out.write(chunk)
                times["theirs restore"].append(time.perf_counter() - started)
                obstore.delete(theirs, [f"sample-{n}/{name}" for name in files])

            for n in range(samples):
                for trip in ((ours_trip, theirs_trip) if n % 2 == 0 else (theirs_trip, ours_trip)):
                    trip(n)
                for kind in ("ours", "theirs"):
                    shutil.rmtree(Path(tmp) / f"{kind}-{n}", ignore_errors=True)
                print(f"sample {n + 1}: " + "  ".join(f"{key} {values[-1]:.2f} s" for key, values in times.items()),
                      flush=True)
    finally:
        server.kill()
        server.wait()
    median = {key: statistics.median(values) for key, values in times.items()}
    print(f"\nmedians of {samples} samples, a checkpoint of {size / (1 << 30):.2f} GiB in {len(files)} files")
    met = True
    for what in ("save", "restore"):
        ratio = median[f"ours {what}"] / median[f"theirs {what}"]
        met = met and ratio <= STORE_GOAL
        print(f"  {what}: trialkit {median[f'ours {what}']:.2f} s ({size / median[f'ours {what}'] / (1 << 20):.0f} MiB/s),"
              f" obstore's own {median[f'theirs {what}']:.2f} s: {ratio:.2f}x (goal <= {STORE_GOAL}x): "
              f"{'MET' if ratio <= STORE_GOAL else 'MISSED'}")
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (default %(default)s)")
    parser.add_argument("--steps", type=int, default=600, help="steps a run (default %(default)s)")
    parser.add_argument("--object-store", action="store_true",
                        help="race a checkpoint's save and restore through trialkit's store against obstore's own")
    parser.add_argument("--gigabytes", type=float, default=1.0, help="--object-store: the checkpoint's size")
    parser.add_argument("--samples", type=int, default=3, help="--object-store: samples of each (default %(default)s)")
    opts = parser.parse_args()
    if opts.object_store:
        return object_store_race(opts.gigabytes, opts.samples)
    default = env.DEFAULT_CHECKPOINT_EVERY
    kinds = {"off": 0.0, f"every {default:g} s": default, "every 1 s": 1.0}
    results: Dict[str, List[Dict[str, object]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="tkbench-ckpt-") as tmp:
        workdir = Path(tmp)
        (workdir / "workload.py").write_text(WORKLOAD)
        for n in range(opts.runs):
            for kind, every in kinds.items():  # alternating: load falls on every kind alike
                results[kind].append(run(kind, every, opts.steps, workdir))
                sample = results[kind][-1]
                print(f"run {n + 1} {kind:12s} step {sample['step'] * 1e3:.3f} ms  init {sample['init']:.2f} s"
                      f"  checkpoints {len(sample['saves'])}", flush=True)
    step = {kind: statistics.median(r["step"] for r in runs) for kind, runs in results.items()}
    init = {kind: statistics.median(r["init"] for r in runs) for kind, runs in results.items()}
    saves = [s for r in results["every 1 s"] for s in r["saves"]]
    save = statistics.median(saves)
    hooked = f"every {default:g} s"
    added = statistics.median(r["added"] for r in results[hooked])
    per_step = added / step["off"]
    share = save / default
    overhead = per_step + share
    print(f"\nmedians of {opts.runs} runs of {opts.steps} steps")
    print(f"  step: off {step['off'] * 1e3:.3f} ms, hooked (nothing due) {step[hooked] * 1e3:.3f} ms "
          f"({step[hooked] / step['off'] - 1:+.2%}, the machine's noise included)")
    print(f"  the hook's own work in a step with nothing due: {added * 1e6:.2f} us ({per_step:.4%} of a step)")
    print(f"  one checkpoint: {save * 1e3:.1f} ms (median of {len(saves)}); at {default:g} s: {share:.4%} of training")
    print(f"  start-up (AdaptDL's reducer): off {init['off']:.2f} s, hooked {init[hooked]:.2f} s")
    verdict = "MET" if overhead < GOAL else "MISSED"
    print(f"overhead at the default interval: {overhead:+.2%} (goal < {GOAL:.0%}): {verdict}")
    return 0 if overhead < GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
