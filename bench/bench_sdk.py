"""What reporting a metric costs, against the real nni 3.0 SDK in the same run.

    .venv/bin/python bench/bench_sdk.py [--calls 100000] [--nni-local-calls 2000] [--rounds 3]

1. report_intermediate_result in a loop: the median of --calls timed calls,
   trialkit's (its trial running under the keeper) and nni's (from the venv
   tools/nni_venv.sh makes) in both of nni's transports: stdout lines (its
   Kubernetes platforms) and the metrics file (local mode, which forks `touch`
   at every call, so it gets fewer calls by default: its median settles fast).
   --rounds rounds, the contestants' order reversed every other round, so a
   machine that slows down or speeds up mid-run favours no one; the figure is
   the median of the rounds' medians. Goal: trialkit at most 0.5x nni.
2. Framing: the record codec (records.metric_frame for the SDK, records.frame
   for the spool) against the hand-written framing it replaced (kept below as
   the peer), in-process, alternating in the same way. Goal: ratio <= 1.0.
3. End to end: --calls records from the SDK through the keeper and its spool
   to the manager on loopback, until they are rows in SQLite: records/s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trialkit import records  # noqa: E402 - after the path is set
from trialkit.manager.store import Store  # noqa: E402

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


def alternating(rounds: int, contestants: dict) -> dict:
    """{name: [a figure per round]}: every contestant once a round, the order reversed every other round."""
    names = list(contestants)
    figures = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            figures[name].append(contestants[name]())
    return figures


def sdk_costs(calls: int, nni_local_calls: int, rounds: int, work: Path) -> None:
    python = nni_python()
    trial = work / "trialkit-trial"

    def ours() -> dict:
        return run_loop([sys.executable, "-m", "trialkit.keeper", "--quiet", "--trial-dir", str(trial), "--",
                         sys.executable], "import trialkit", "trialkit.report_intermediate_result", calls, work)

    def nni(platform: str, n: int):
        def run() -> dict:
            sys_dir = work / f"nni-{platform}-{len(list(work.iterdir()))}"
            sys_dir.mkdir()
            (sys_dir / "parameter.cfg").write_text(json.dumps(
                {"parameter_id": 0, "parameter_source": "algorithm", "parameters": {}, "parameter_index": 0}))
            return run_loop([python], "import nni; nni.get_next_parameter()", "nni.report_intermediate_result", n,
                            work, NNI_PLATFORM=platform, NNI_SYS_DIR=str(sys_dir), NNI_OUTPUT_DIR=str(sys_dir),
                            NNI_TRIAL_JOB_ID="bench", NNI_EXP_ID="bench")
        return run

    figures = alternating(rounds, {"trialkit": ours, "kubeflow": nni("kubeflow", calls),
                                   "local": nni("local", nni_local_calls)})
    median = {name: statistics.median(f["median_ns"] for f in runs) for name, runs in figures.items()}
    mean = {name: statistics.median(f["mean_ns"] for f in runs) for name, runs in figures.items()}
    print(f"report_intermediate_result: median per call over {rounds} alternating rounds (mean in brackets)")
    print(f"  trialkit, under its keeper    {median['trialkit'] / 1000:9.2f} us ({mean['trialkit'] / 1000:.2f})"
          f"   {calls} calls a round")
    for platform, label, n in (("kubeflow", "nni 3.0, stdout lines", calls),
                               ("local", "nni 3.0, local metrics file", nni_local_calls)):
        ratios = [a["median_ns"] / b["median_ns"] for a, b in zip(figures["trialkit"], figures[platform])]
        print(f"  {label:29} {median[platform] / 1000:9.2f} us ({mean[platform] / 1000:.2f})   {n} calls a round"
              f"   trialkit/nni = {statistics.median(ratios):.4f} (rounds: "
              f"{', '.join(f'{r:.3f}' for r in ratios)}; goal <= 0.5)")


# The framing the SDK and the spool wrote by hand before records.metric_frame/records.frame: the peer.
def handwritten_metric(kind: str, sequence: int, when: float, value: str, tail: str) -> bytes:
    return ('\x1e{"type":"%s","sequence":%d,"time":%r,"value":%s,%s\n' % (kind, sequence, when, value, tail)).encode()


def handwritten_spooled(seq: int, rec: dict) -> bytes:
    return b'\x1e{"seq":%d,%s\n' % (seq, records.dumps(rec)[1:].encode())


def framing_costs(calls: int, rounds: int) -> None:
    if not hasattr(records, "metric_frame"):
        print("framing: this tree has no record codec to race (records.metric_frame)")
        return
    tail = records.dumps({"parameter_id": 7, "trial_job_id": "abcd1234-00007"})[1:]
    rec = {"type": "PERIODICAL", "parameter_id": 7, "trial_job_id": "abcd1234-00007", "sequence": 12,
           "value": 0.123456789, "time": 1764000000.123456, "source": "channel"}
    assert records.metric_frame("PERIODICAL", 3, 1.5, "0.25", tail) == handwritten_metric("PERIODICAL", 3, 1.5,
                                                                                          "0.25", tail)
    assert records.frame('{"seq":%d,%s' % (9, records.dumps(rec)[1:])) == handwritten_spooled(9, rec)

    def timed(encode) -> float:
        pc = time.perf_counter_ns
        start = pc()
        for i in range(calls):
            encode(i)
        return (pc() - start) / calls

    pairs = {
        "SDK record": (lambda i: records.metric_frame("PERIODICAL", i, 1764000000.5, "0.25", tail),
                       lambda i: handwritten_metric("PERIODICAL", i, 1764000000.5, "0.25", tail)),
        "spool line": (lambda i: records.frame('{"seq":%d,%s' % (i, records.dumps(rec)[1:])),
                       lambda i: handwritten_spooled(i, rec)),
    }
    print(f"framing: ns per frame, {calls} frames a round, {rounds} alternating rounds (median of rounds)")
    for label, (codec, peer) in pairs.items():
        figures = alternating(rounds, {"codec": lambda: timed(codec), "peer": lambda: timed(peer)})
        ratios = [a / b for a, b in zip(figures["codec"], figures["peer"])]
        print(f"  {label}: records codec {statistics.median(figures['codec']):7.1f}   hand-written "
              f"{statistics.median(figures['peer']):7.1f}   codec/hand-written = {statistics.median(ratios):.3f} "
              f"(goal <= 1.0)")


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
    # Counted by type: the trial's own output line ("sdk ...") is a row too, a LOG record (this count once
    # took all rows less two statuses, and failed on that line as a 100,003rd row).
    metrics = [rec["sequence"] for rec in store.records_for("t1", type=records.PERIODICAL)]
    statuses = [rec["value"]["status"] for rec in store.records_for("t1", type=records.STATUS)]
    sdk_seconds = float(keeper.stdout.split()[-1])
    assert keeper.returncode == 0 and sorted(metrics) == list(range(calls)) and statuses == ["RUNNING", "SUCCEEDED"], (
        keeper.returncode, len(metrics), len(set(metrics)), statuses, keeper.stderr[-2000:])
    print(f"end to end: {calls} records SDK -> channel -> keeper -> spool -> HTTP -> SQLite rows")
    print(f"  {elapsed:.2f} s from the keeper's start to its exit (every row committed): "
          f"{calls / elapsed:,.0f} records/s")
    print(f"  the trial's own loop took {sdk_seconds:.2f} s: delivery/reporting time = {elapsed / sdk_seconds:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--nni-local-calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each race")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trialkit-bench-") as tmp:
        work = Path(tmp)
        sdk_costs(opts.calls, opts.nni_local_calls, opts.rounds, work)
        framing_costs(opts.calls, opts.rounds * 2 + 1)
        end_to_end(opts.calls, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
