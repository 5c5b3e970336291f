"""What reporting a metric costs, against the real nni 3.0 SDK in the same run.

    .venv/bin/python bench/bench_sdk.py [--calls 100000] [--nni-local-calls 2000]

1. report_intermediate_result in a loop: the median of --calls timed calls,
   trialkit's (its trial running under the keeper) and nni's (from the venv
   tools/nni_venv.sh makes) in both of nni's transports: stdout lines (its
   Kubernetes platforms) and the metrics file (local mode, which forks `touch`
   at every call, so it gets fewer calls by default: its median settles fast).
   Goal: trialkit at most 0.5x nni.
2. End to end: --calls records from the SDK through the keeper and its spool
   to the manager on loopback, until they are rows in SQLite: records/s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trialkit.manager.store import Store  # noqa: E402 - after the path is set

LOOP = """
import json, os, statistics, time
{setup}
report = {report}
pc = time.perf_counter_ns
n = int(os.environ["BENCH_CALLS"])
costs = [0] * n
start = pc()
for i in range(n):
    t = pc()
    report(i * 0.5)
    costs[i] = pc() - t
total = pc() - start
with open(os.environ["BENCH_OUT"], "w") as f:
    json.dump({{"median_ns": statistics.median(costs), "mean_ns": total / n}}, f)
"""


def base_environ(**extra: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TRIALKIT_", "NNI_"))}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(extra)
    return environ


def run_loop(argv_prefix, setup: str, report: str, calls: int, work: Path, **environ: str) -> dict:
    script = work / f"loop-{len(list(work.iterdir()))}.py"
    script.write_text(LOOP.format(setup=setup, report=report))
    out = work / (script.stem + ".json")
    done = subprocess.run([*argv_prefix, str(script)], env=base_environ(BENCH_CALLS=str(calls), BENCH_OUT=str(out),
                                                                        **environ),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{argv_prefix[0]} {script.name} failed: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def nni_python() -> str:
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def sdk_costs(calls: int, nni_local_calls: int, work: Path) -> None:
    trial = work / "trialkit-trial"
    ours = run_loop([sys.executable, "-m", "trialkit.keeper", "--quiet", "--trial-dir", str(trial), "--",
                     sys.executable], "import trialkit", "trialkit.report_intermediate_result", calls, work)
    python = nni_python()
    results = {}
    for platform, n in (("kubeflow", calls), ("local", nni_local_calls)):
        sys_dir = work / f"nni-{platform}"
        sys_dir.mkdir()
        (sys_dir / "parameter.cfg").write_text(json.dumps(
            {"parameter_id": 0, "parameter_source": "algorithm", "parameters": {}, "parameter_index": 0}))
        results[platform] = (n, run_loop([python], "import nni; nni.get_next_parameter()",
                                         "nni.report_intermediate_result", n, work, NNI_PLATFORM=platform,
                                         NNI_SYS_DIR=str(sys_dir), NNI_OUTPUT_DIR=str(sys_dir),
                                         NNI_TRIAL_JOB_ID="bench", NNI_EXP_ID="bench"))
    print("report_intermediate_result: median per call (mean in brackets)")
    print(f"  trialkit, under its keeper    {ours['median_ns'] / 1000:9.2f} us ({ours['mean_ns'] / 1000:.2f})"
          f"   {calls} calls")
    for platform, label in (("kubeflow", "nni 3.0, stdout lines"), ("local", "nni 3.0, local metrics file")):
        n, theirs = results[platform]
        ratio = ours["median_ns"] / theirs["median_ns"]
        print(f"  {label:29} {theirs['median_ns'] / 1000:9.2f} us ({theirs['mean_ns'] / 1000:.2f})"
              f"   {n} calls   trialkit/nni = {ratio:.4f} (goal <= 0.5)")


END_TO_END = """
import time, trialkit
n = {calls}
start = time.perf_counter()
for i in range(n):
    trialkit.report_intermediate_result(i * 0.5)
print(f"sdk {{time.perf_counter() - start}}", flush=True)
"""


def end_to_end(calls: int, work: Path) -> None:
    exp = work / "exp"
    store = Store.in_dir(exp)
    store.create_experiment("bench")
    store.add_trial("bench", "t1", sequence=0, parameters={}, token="bench-token")
    server = subprocess.Popen([sys.executable, "-m", "trialkit.manager.server", "--experiment-dir", str(exp)],
                              env=base_environ(), stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().split()[-1]
        script = work / "e2e.py"
        script.write_text(END_TO_END.format(calls=calls))
        start = time.perf_counter()
        keeper = subprocess.run(
            [sys.executable, "-m", "trialkit.keeper", "--trial-dir", str(work / "e2e-trial"), "--flush-seconds", "600",
             "--", sys.executable, str(script)],
            env=base_environ(TRIALKIT_TRIAL_ID="t1", TRIALKIT_TOKEN="bench-token", TRIALKIT_MANAGER_URL=url),
            capture_output=True, text=True, timeout=900)
        elapsed = time.perf_counter() - start
    finally:
        server.kill()
        server.wait()
    rows = store.count_records("t1")
    metrics = rows - 2  # RUNNING and SUCCEEDED
    sdk_seconds = float(keeper.stdout.split()[-1])
    assert keeper.returncode == 0 and metrics == calls, (keeper.returncode, rows, keeper.stderr[-2000:])
    print(f"end to end: {calls} records SDK -> channel -> keeper -> spool -> HTTP -> SQLite rows")
    print(f"  {elapsed:.2f} s from the keeper's start to its exit (every row committed): "
          f"{calls / elapsed:,.0f} records/s")
    print(f"  the trial's own loop took {sdk_seconds:.2f} s: delivery/reporting time = {elapsed / sdk_seconds:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--nni-local-calls", type=int, default=2000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trialkit-bench-") as tmp:
        work = Path(tmp)
        sdk_costs(opts.calls, opts.nni_local_calls, work)
        end_to_end(opts.calls, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
